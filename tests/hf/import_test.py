"""Models in: a Hugging Face GPT-2 (transformers' save_pretrained) as the
parameters of `dtrain eval` and as the starting point of `dtrain train`
(model.init_from).

- A randomly initialised GPT2LMHeadModel (2 layers, 2 heads, width 32,
  vocabulary 256) saved with save_pretrained: `dtrain eval --checkpoint
  DIR` on a byte-token dataset reports the mean cross-entropy that
  transformers computes on the same windows (built from the h5 file as
  dtrain builds them: (N - 1) / seq_len windows, one fewer when there are
  two or more, at offset 0), within 1e-5; with activation_function gelu
  (model.gelu exact) and gelu_new (model.gelu tanh), with n_positions
  larger than data.seq_len (wpe's first rows), and untied.
- `dtrain train --set model.init_from=DIR` starts from it: its first
  logged training loss is near transformers' loss, not the ~5.5 of a
  random initialisation; a resumed run says init_from is not used.
- The same from a safetensors file with GPT-2's names and with dtrain's
  (dtrain export of the imported model): the same eval loss.
- Refusals (65, naming what differs; 66 for a missing path): n_layer,
  a tensor of another shape, activation_function relu, the wrong
  model.gelu.

  import_test.py --dtrain DTRAIN --workdir DIR --source SRC
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
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (DTRAIN_WITH_HF=1 bash launch/setup.sh makes build/hf-venv)")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("--dtrain", required=True)
ap.add_argument("--workdir", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()
shutil.rmtree(args.workdir, ignore_errors=True)
os.makedirs(args.workdir)
os.chdir(args.workdir)
torch.manual_seed(0)
torch.set_num_threads(1)
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def dtrain(*cmd, want=0):
    p = subprocess.run([args.dtrain, *cmd], capture_output=True, text=True)
    if p.returncode != want:
        print(p.stdout + p.stderr)
        raise SystemExit(f"dtrain {' '.join(cmd)}: exit {p.returncode}, expected {want}")
    return p.stdout + p.stderr


text = open(os.path.join(args.source, "docs", "training.md"), "rb").read()[:60000]
open("text.txt", "wb").write(text)
dtrain("data", "import", "text", "text.txt", "-o", "text.h5", "--val-fraction", "0.05")
T = 32
with h5py.File("text.h5", "r") as f:
    val = f["val/tokens"][:].astype(np.int64)
w = (len(val) - 1) // T
w = w - 1 if w >= 2 else w
x = torch.tensor(np.stack([val[k * T:k * T + T] for k in range(w)]))
y = torch.tensor(np.stack([val[k * T + 1:k * T + T + 1] for k in range(w)]))


def job(name, extra=""):
    open(f"{name}.yaml", "w").write(f"""model: {{type: gpt, n_layer: 2, n_head: 2, n_embd: 32, dropout: 0{extra}}}
data: {{path: text.h5, test_split: val, seq_len: {T}}}
train: {{steps: 4, global_batch: 8, log_every: 1, eval_batch: 16,
         optimizer: {{name: adamw, lr: 0.0003}}}}
runtime: {{progress: off}}
output: {{dir: run_{name}}}
""")
    return f"{name}.yaml"


def hf_model(name, scale=1.0, **cfg):
    c = dict(n_layer=2, n_head=2, n_embd=32, n_positions=T, vocab_size=256,
             activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    c.update(cfg)
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(**c)).eval()
    with torch.no_grad():
        m.transformer.wte.weight.mul_(scale)
    m.save_pretrained(name, safe_serialization=True)
    with torch.no_grad():
        logits = m(x).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256).double(),
                                                   y.reshape(-1)))


def eval_loss(out):
    return float(re.search(r"test loss ([0-9.]+)", out).group(1))


cases = [("exact", {}, ""), ("tanh", {"activation_function": "gelu_new"}, ", gelu: tanh"),
         ("long", {"n_positions": 64}, ""),
         ("untied", {"tie_word_embeddings": False}, ", tie_embeddings: false")]
for name, cfg, extra in cases:
    want = hf_model(f"hf_{name}", **cfg)
    got = eval_loss(dtrain("eval", job(name, extra), "--checkpoint", f"hf_{name}"))
    check(abs(got - want) < 1e-5, f"{name}: dtrain eval {got:.6f}, transformers {want:.6f}")

# a safetensors file with GPT-2's names, and dtrain's export of the import
shutil.copy("hf_exact/model.safetensors", "gpt2_names.safetensors")
want = hf_model("hf_exact2", scale=40.0)
shutil.copy("hf_exact2/model.safetensors", "gpt2_names.safetensors")
got = eval_loss(dtrain("eval", "exact.yaml", "--checkpoint", "gpt2_names.safetensors"))
check(abs(got - want) < 1e-5, f"GPT-2 names in a safetensors file: {got:.6f} against {want:.6f}")

# fine-tuning from it (its embeddings scaled so that its loss is far from a
# random initialisation's ln 256 = 5.55)
out = dtrain("train", "exact.yaml", "--set", "model.init_from=hf_exact2")
import json
first = next(json.loads(l)["loss"] for l in open("run_exact/metrics.jsonl")
             if '"type":"train"' in l)
check("parameters from hf_exact2 (model.init_from)" in out and abs(first - want) < 0.2 * want
      and abs(first - 5.55) > 1.0,
      f"model.init_from: the first training loss {first:.4f}, transformers' val loss {want:.4f}")
dtrain("export", "exact.yaml", "--checkpoint", "run_exact/model.h5", "-o", "tuned.safetensors")
tuned = eval_loss(dtrain("eval", "exact.yaml", "--checkpoint", "tuned.safetensors"))
check(tuned < want, f"4 steps of fine-tuning lower the loss: {tuned:.4f} < {want:.4f}")
out = dtrain("train", "exact.yaml", "--set", "model.init_from=hf_exact2", "--set",
             "train.steps=6")
check("model.init_from (hf_exact2) is not used" in out,
      "a resumed run says model.init_from is not used")

# refusals
out = dtrain("eval", "exact.yaml", "--set", "model.n_layer=3", "--checkpoint", "hf_exact", want=65)
check("n_layer is 2, the job's model.n_layer is 3" in out and "h2.qkv.weight is missing" in out,
      "n_layer differs: 65, " + out.strip().splitlines()[-1][:160])
out = dtrain("train", "exact.yaml", "--set", "model.gelu=tanh", "--set",
             "model.init_from=hf_exact", "--set", "output.dir=run_bad", want=65)
check("set model.gelu: exact" in out, "model.gelu differs: 65")
sd = load_file("hf_exact/model.safetensors")
sd["transformer.h.0.mlp.c_fc.bias"] = torch.zeros(64)
save_file(sd, "badshape.safetensors", metadata={"format": "pt"})
out = dtrain("eval", "exact.yaml", "--checkpoint", "badshape.safetensors", want=65)
check("tensor h0.fc.bias is 64 in the file, 128 in the model" in out,
      "a tensor of another shape: 65, " + out.strip().splitlines()[-1][-120:])
os.makedirs("relu")
shutil.copy("hf_exact/model.safetensors", "relu/model.safetensors")
cfg = open("hf_exact/config.json").read().replace('"activation_function": "gelu"',
                                                   '"activation_function": "relu"')
open("relu/config.json", "w").write(cfg)
out = dtrain("eval", "exact.yaml", "--checkpoint", "relu", want=65)
check("activation_function" in out and "relu" in out, "activation_function relu: 65")
out = dtrain("train", "exact.yaml", "--set", "model.init_from=nowhere", "--set",
             "output.dir=run_none", want=66)
check("nowhere" in out, "a missing model.init_from: 66")
print(f"import_test: {failures} failed")
sys.exit(1 if failures else 0)
