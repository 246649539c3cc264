"""`dtrain export` against the libraries that read its files.

- GPT: a tiny GPT trained a few steps on the bytes of the docs, exported
  as a Hugging Face GPT-2 directory, loads in transformers'
  GPT2LMHeadModel; its next-token log-probabilities on random token
  windows match dtrain's (gpt_probs, from the safetensors export with
  dtrain's names) within 1e-4; the same with untied embeddings and with
  the tanh GELU (config.json's activation_function gelu_new).
- The quick-start MLP and the CNN (batch norm's running statistics among
  the tensors) exported as safetensors load into matching torch.nn
  models with safetensors.torch.load_file; the test split read with
  h5py and normalised as dtrain does scores the accuracy `dtrain eval`
  prints, to one sample.
- Refusals: --format hf of an MLP (64), a missing checkpoint (66), an
  existing output without --force (64, the file unchanged); with --force
  it is replaced.

  export_test.py --dtrain DTRAIN --probs GPT_PROBS --workdir DIR --source SRC
Exits 77 when transformers, safetensors or torch cannot be imported.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (DTRAIN_WITH_HF=1 bash launch/setup.sh makes build/hf-venv)")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("--dtrain", required=True)
ap.add_argument("--probs", required=True)
ap.add_argument("--workdir", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()
shutil.rmtree(args.workdir, ignore_errors=True)
os.makedirs(args.workdir)
os.chdir(args.workdir)
torch.set_num_threads(1)
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def run(*cmd, want=0):
    p = subprocess.run([args.dtrain, *cmd], capture_output=True, text=True)
    if p.returncode != want:
        print(p.stdout + p.stderr)
        raise SystemExit(f"dtrain {' '.join(cmd)}: exit {p.returncode}, expected {want}")
    return p.stdout + p.stderr


# ---- GPT ---------------------------------------------------------------
with open("text.txt", "wb") as out:
    for f in sorted(glob.glob(os.path.join(args.source, "docs", "*.md"))):
        out.write(open(f, "rb").read())
run("data", "import", "text", "text.txt", "-o", "text.h5")
T, ROWS = 32, 3
base = f"""model: {{type: gpt, n_layer: 2, n_head: 2, n_embd: 32, dropout: 0}}
data: {{path: text.h5, test_split: val, seq_len: {T}}}
train: {{steps: 30, global_batch: 8, log_every: 10, optimizer: {{name: adamw, lr: 0.003}}}}
runtime: {{progress: off}}
"""
rng = np.random.default_rng(1)
x = rng.integers(0, 256, size=(ROWS, T))
x.astype(np.float32).tofile("x.bin")
for name, extra, act in [("tied", "", "gelu"),
                         ("untied", "--set model.tie_embeddings=false", "gelu"),
                         ("tanh", "--set model.gelu=tanh", "gelu_new")]:
    sets = extra.split() if extra else []
    open(f"{name}.yaml", "w").write(base + f"output: {{dir: run_{name}}}\n")
    run("train", f"{name}.yaml", *sets)
    run("export", f"{name}.yaml", *sets, "--checkpoint", f"run_{name}/model.h5", "-o", f"hf_{name}")
    run("export", f"{name}.yaml", *sets, "--checkpoint", f"run_{name}/model.h5", "-o",
        f"{name}.safetensors")
    job = f"{name}.yaml"
    if sets:  # gpt_probs reads the job file alone: write the setting into it
        key, val = sets[1].split("=")
        k = key.split(".")[1]
        open(job, "w").write(base.replace("dropout: 0}", f"dropout: 0, {k}: {val}}}")
                             + f"output: {{dir: run_{name}}}\n")
    subprocess.run([args.probs, job, f"{name}.safetensors", "x.bin", str(ROWS), str(T), "256",
                    "p.bin"], check=True)
    p = np.fromfile("p.bin", dtype=np.float32).reshape(ROWS, T, -1)
    cfg = transformers.GPT2Config.from_pretrained(f"hf_{name}")
    check(cfg.activation_function == act and cfg.tie_word_embeddings == (name != "untied"),
          f"{name}: config.json says {cfg.activation_function}, tied {cfg.tie_word_embeddings}")
    model = transformers.GPT2LMHeadModel.from_pretrained(f"hf_{name}").eval()
    with torch.no_grad():
        logits = model(torch.tensor(x)).logits.double()
    theirs = torch.log_softmax(logits, dim=-1).numpy()
    ours = np.log(p.astype(np.float64))
    gap = float(np.abs(theirs - ours).max())
    check(gap < 1e-4, f"{name}: log-probabilities of transformers and dtrain differ by {gap:.2e}")
    # the HF file holds GPT-2's names and Conv1D layouts; dtrain's its own
    hf = load_file(f"hf_{name}/model.safetensors")
    dt = load_file(f"{name}.safetensors")
    same = torch.equal(hf["transformer.h.0.attn.c_attn.weight"], dt["h0.qkv.weight"].t()) and \
        torch.equal(hf["transformer.wte.weight"], dt["wte.weight"])
    check(same and (("lm_head.weight" in hf) == (name == "untied")),
          f"{name}: names and layouts of the two files")

# ---- MLP and CNN ---------------------------------------------------------
data = os.path.join(args.source, "data", "fashion-mnist.h5")
with h5py.File(data, "r") as f:
    scale, mean, std = (np.float32(f.attrs[k]) for k in ("norm_scale", "norm_mean", "norm_std"))
    xs = f["test/x"][:].astype(np.float32)
    ys = f["test/y"][:].astype(np.int64)
xs = (xs * scale - mean) / std
common = ["--set", f"data.path={data}", "--set", "train.steps=60", "--set",
          "train.schedule.warmup_steps=10", "--set", "runtime.progress=off"]


def mlp_model(w):
    layers, i = [torch.nn.Flatten()], 1
    while f"fc{i}.weight" in w:
        lin = torch.nn.Linear(w[f"fc{i}.weight"].shape[1], w[f"fc{i}.weight"].shape[0])
        lin.weight.data, lin.bias.data = w[f"fc{i}.weight"], w[f"fc{i}.bias"]
        layers.append(lin)
        if f"fc{i + 1}.weight" in w:
            layers.append(torch.nn.ReLU())
        i += 1
    return torch.nn.Sequential(*layers)


def cnn_model(w):
    layers, s = [], 1
    while f"stage{s}.conv.weight" in w:
        cw = w[f"stage{s}.conv.weight"]
        conv = torch.nn.Conv2d(cw.shape[1], cw.shape[0], 3, padding=1, bias=False)
        conv.weight.data = cw
        bn = torch.nn.BatchNorm2d(cw.shape[0], eps=1e-5)
        for k in ("weight", "bias", "running_mean", "running_var"):
            getattr(bn, k).data = w[f"stage{s}.bn.{k}"]
        layers += [conv, bn, torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        s += 1
    return torch.nn.Sequential(*layers, *mlp_model(w))


for kind, build, shape in [("mlp", mlp_model, (-1, 28, 28)), ("cnn", cnn_model, (-1, 1, 28, 28))]:
    job = os.path.join(args.source, "configs", f"fashion-mnist-{kind}.yaml")
    run("train", job, *common, "--set", f"output.dir={kind}")
    ckpt = sorted(glob.glob(f"{kind}/checkpoints/ckpt-*.h5"))[-1]
    out = run("eval", job, *common, "--checkpoint", ckpt)
    acc = float(re.search(r"test loss [0-9.]+, test accuracy (0\.[0-9]+) \(checkpoint", out).group(1))
    run("export", job, *common, "--checkpoint", ckpt, "-o", f"{kind}.safetensors")
    meta = safe_open(f"{kind}.safetensors", "pt").metadata()
    check(meta.get("dtrain_model_type") == kind and meta.get("format") == "pt",
          f"{kind}: metadata {meta}")
    model = build(load_file(f"{kind}.safetensors")).eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(xs.reshape(shape))).argmax(dim=1).numpy()
    correct = int((pred == ys).sum())
    want = round(acc * len(ys))
    check(abs(correct - want) <= 1,
          f"{kind}: PyTorch {correct} of {len(ys)} correct, dtrain eval {acc} ({want})")

# ---- refusals --------------------------------------------------------------
mlp = os.path.join(args.source, "configs", "fashion-mnist-mlp.yaml")
ckpt = sorted(glob.glob("mlp/checkpoints/ckpt-*.h5"))[-1]
out = run("export", mlp, *common, "--checkpoint", ckpt, "-o", "mlp_hf", "--format", "hf", want=64)
check("use --format safetensors" in out and not os.path.exists("mlp_hf"), "hf of an MLP: 64")
out = run("export", mlp, *common, "--checkpoint", "nope.h5", "-o", "x.safetensors", want=66)
check(not os.path.exists("x.safetensors"), "a missing checkpoint: 66, nothing written")
before = open("mlp.safetensors", "rb").read()
out = run("export", mlp, *common, "--checkpoint", ckpt, "-o", "mlp.safetensors", want=64)
check("--force" in out and open("mlp.safetensors", "rb").read() == before,
      "an existing output without --force: 64, unchanged")
run("export", "tied.yaml", "--checkpoint", "run_tied/model.h5", "-o", "mlp.safetensors", "--force")
check("wte.weight" in load_file("mlp.safetensors"), "--force replaces it")
run("export", "tied.yaml", "--checkpoint", "run_tied/model.h5", "-o", "hf_tied", "--force")
check(transformers.GPT2LMHeadModel.from_pretrained("hf_tied") is not None and
      not glob.glob("hf_tied.*"), "--force replaces a directory, leaving nothing beside it")
print(f"export_test: {failures} failed")
sys.exit(1 if failures else 0)
