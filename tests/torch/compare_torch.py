#!/usr/bin/env python3
"""dtrain against PyTorch on the same models, weights and batch.

For an MLP with SGD (momentum, Nesterov, weight decay) and AdamW and each
activation, for an MLP with RMS norm (the formula written out: torch 1.13
has no nn.RMSNorm), for a convolutional network (conv2d with padding, stride,
dilation and groups, batch norm, max and average pooling, a residual sum,
layer norm, global average pooling), and for a small GPT (model.type
gpt: token and learned position embeddings, pre-norm blocks of causal
multi-head attention with a fused qkv projection and a GELU MLP, the head
tied to the token embedding or not, the vocabulary padded or not,
model.recompute none or all, layer norm or RMS norm (model.norm),
GPT-2's initialisation and one ten times as
wide with random biases and norms), torch_step runs dtrain's model for a
few optimizer steps on one batch; this script loads dtrain's initial
weights into an identical torch.nn model, repeats the steps with
torch.optim (the same parameter groups: weight decay on weights only,
embeddings included, unless a case says otherwise), and checks:
  - the loss matches within 1e-4 relative, every step;
  - every parameter gradient matches within 1e-4 relative to the tensor's
    largest gradient, every step;
  - the parameters after each optimizer step, taken from the same
    gradients on both sides, match within 1e-5 relative to the tensor's
    largest value;
  - batch norm's running statistics after each step match within 1e-5;
  - with model.recompute all, dtrain's activation arena is smaller and its
    gradients are bit-identical to those of the same GPT without
    recomputation.
Exit 0 when all match, 1 on a mismatch, 77 (skipped) without PyTorch.
"""
import argparse
import os
import re
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # reported as skipped by ctest, never as passed
    print(f"SKIP: PyTorch/numpy not importable ({e}); install python3-torch")
    sys.exit(77)

ROWS, SIDE, CLASSES, STEPS = 64, 28, 10, 3
HIDDEN = [48, 32]
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-4, 1e-4, 1e-5

CASES = [
    ("mlp", "sgd", "relu", {"lr": 0.05, "momentum": 0.9, "nesterov": "false",
                            "weight_decay": 0.01}),
    ("mlp", "sgd", "tanh", {"lr": 0.05, "momentum": 0.9, "nesterov": "true",
                            "weight_decay": 0.001, "bias_weight_decay": 0.001}),
    ("mlp", "adamw", "gelu", {"lr": 0.001, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999,
                              "eps": 1e-8}),
    ("mlp", "adamw", "relu", {"lr": 0.003, "weight_decay": 0.1, "beta1": 0.8, "beta2": 0.99,
                              "eps": 1e-6}),
    ("mlp", "adamw", "silu", {"lr": 0.003, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.99,
                              "eps": 1e-8}),
    ("rms", "adamw", "silu", {"lr": 0.003, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.99,
                              "eps": 1e-8, "norm_weight_decay": 0.01}),
    ("cnn", "sgd", "relu", {"lr": 0.05, "momentum": 0.9, "nesterov": "false",
                            "weight_decay": 0.01, "norm_weight_decay": 0.001}),
    ("cnn", "adamw", "relu", {"lr": 0.003, "weight_decay": 0.05, "beta1": 0.9, "beta2": 0.999,
                              "eps": 1e-8}),
]

# The GPT cases: 2 layers, 2 heads, width 32, windows of 16 tokens over a
# vocabulary of 64; AdamW with decay on weights and embeddings only. The
# recompute case is the tied one with model.recompute all.
GPT_ROWS, GPT_SEQ, GPT_VOCAB = 8, 16, 64
GPT_MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0}
GPT_HP = {"lr": 0.003, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
          "bias_weight_decay": 0.0, "norm_weight_decay": 0.0}
GPT_CASES = [
    ("gpt-tied", {"tie_embeddings": "true", "vocab_size": 0, "recompute": "none"}),
    ("gpt-untied-padded", {"tie_embeddings": "false", "vocab_size": 80, "recompute": "none"}),
    ("gpt-recompute", {"tie_embeddings": "true", "vocab_size": 0, "recompute": "all"}),
    ("gpt-wide", {"tie_embeddings": "true", "vocab_size": 0, "recompute": "none"}),
    ("gpt-rmsnorm", {"tie_embeddings": "true", "vocab_size": 0, "recompute": "none",
                     "norm": "rmsnorm"}),
]
# The cases that start from weights 10 times GPT-2's, with random biases
# and norm scales (see widen).
WIDE = ("gpt-wide", "gpt-rmsnorm")
# GPT-2's initial weights (std 0.02) keep every GELU input and attention
# score near 0, where a wrong GELU or softmax scale hardly shows; gpt-wide
# starts from weights 10 times as large and random biases and norms, and
# gpt-rmsnorm (model.norm rmsnorm) likewise.


def widen(layout, params0):
    rng = np.random.default_rng(7)
    out = params0.copy()
    for name, off, group, shape in layout:
        n = int(np.prod(shape))
        if group == "weight":
            out[off:off + n] *= 10
        else:
            out[off:off + n] += rng.normal(0.0, 0.1, n).astype(np.float32)
    return out


class TorchGPT(torch.nn.Module):
    """GPT-2's layout written out: pre-norm blocks, causal attention with
    explicit scores, exact GELU, the head without bias (tied: wte's
    weight). Attribute names follow dtrain's tensor names (h.0.qkv for
    h0.qkv)."""

    class Block(torch.nn.Module):
        def __init__(self, c, heads, norm):
            super().__init__()
            nn = torch.nn
            self.heads = heads
            self.ln1 = norm(c)
            self.qkv = nn.Linear(c, 3 * c)
            self.proj = nn.Linear(c, c)
            self.ln2 = norm(c)
            self.fc = nn.Linear(c, 4 * c)
            self.fc2 = nn.Linear(4 * c, c)

        def attention(self, x):
            b, t, c = x.shape
            dh = c // self.heads
            q, k, v = self.qkv(x).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, dh).transpose(1, 2) for z in (q, k, v))
            scores = q @ k.transpose(-2, -1) / (dh ** 0.5)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            out = torch.softmax(scores, dim=-1) @ v
            return self.proj(out.transpose(1, 2).reshape(b, t, c))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc2(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    def __init__(self, vocab, seq, c, layers, heads, tied, rms=False):
        super().__init__()
        nn = torch.nn
        norm = (lambda d: TorchRMSNorm(d, 1e-5)) if rms else nn.LayerNorm
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.h = nn.ModuleList([TorchGPT.Block(c, heads, norm) for _ in range(layers)])
        self.ln_f = norm(c)
        self.head = None if tied else nn.Linear(c, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        w = self.wte.weight if self.head is None else self.head.weight
        return x @ w.t()


# The convolutional case, as dtrain layers and as the same torch module.
CNN_LAYERS = [
    "{name: conv1, kind: conv2d, out: 8, kernel: 3, padding: 1, bias: false}",
    "{name: bn1, kind: batchnorm}",
    "{name: relu1, kind: relu}",
    "{name: pool1, kind: maxpool2d, kernel: 2}",
    "{name: conv2, kind: conv2d, out: 8, kernel: 3, padding: 2, dilation: 2, bias: false}",
    "{name: bn2, kind: batchnorm}",
    "{name: sum, kind: add, inputs: [bn2, pool1]}",
    "{name: relu2, kind: relu}",
    "{name: conv3, kind: conv2d, out: 12, kernel: [3, 5], stride: 2, padding: [1, 2], "
    "groups: 4}",
    "{name: pool2, kind: avgpool2d, kernel: 3, stride: 2, padding: 1}",
    "{name: gap, kind: global_avgpool}",
    "{name: ln, kind: layernorm}",
    "{name: fc, kind: linear, out: classes}",
]


# An MLP with RMS norm (eps as a layer setting) and the given activation.
RMS_LAYERS = [
    "{name: flat, kind: flatten}",
    "{name: fc1, kind: linear, out: 48}",
    "{name: rms, kind: rmsnorm, eps: 1e-3}",
    "{name: act, kind: ACT}",
    "{name: fc2, kind: linear, out: classes}",
]


class TorchRMSNorm(torch.nn.Module):
    """y = x / sqrt(mean(x^2 over the last dimension) + eps) * weight (torch
    1.13 has no nn.RMSNorm)."""

    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class TorchRMSMLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = {"relu": torch.relu, "silu": torch.nn.functional.silu}[act]
        self.fc1 = torch.nn.Linear(SIDE * SIDE, 48)
        self.rms = TorchRMSNorm(48, 1e-3)
        self.fc2 = torch.nn.Linear(48, CLASSES)

    def forward(self, x):
        return self.fc2(self.act(self.rms(self.fc1(x.flatten(1)))))


class TorchCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        # no bias before batch norm: its gradient is zero up to rounding,
        # so no relative comparison could hold
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 12, (3, 5), stride=2, padding=(1, 2), groups=4)
        self.pool2 = nn.AvgPool2d(3, stride=2, padding=1)
        self.ln = nn.LayerNorm(12)
        self.fc = nn.Linear(12, CLASSES)

    def forward(self, x):
        p1 = self.pool1(torch.relu(self.bn1(self.conv1(x.unsqueeze(1)))))
        h = torch.relu(self.bn2(self.conv2(p1)) + p1)
        h = self.pool2(self.conv3(h))
        return self.fc(self.ln(h.mean(dim=(2, 3))))


class TorchMLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = {"relu": torch.relu, "tanh": torch.tanh,
                    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}[act]
        dims = [SIDE * SIDE] + HIDDEN + [CLASSES]
        for i in range(len(dims) - 1):
            setattr(self, f"fc{i + 1}", torch.nn.Linear(dims[i], dims[i + 1]))
        self.n = len(dims) - 1

    def forward(self, x):
        h = x.flatten(1)
        for i in range(1, self.n + 1):
            h = getattr(self, f"fc{i}")(h)
            if i < self.n:
                h = self.act(h)
        return h


def write_job(path, model, opt, act, hp):
    if model == "mlp":
        lines = ["model:", "  type: mlp", f"  hidden: [{', '.join(map(str, HIDDEN))}]",
                 f"  activation: {act}", "  dropout: 0", "  init: kaiming"]
    elif model == "cnn":
        lines = ["model:", "  type: layers", "  layers:"] + [f"    - {l}" for l in CNN_LAYERS]
    elif model == "rms":
        lines = ["model:", "  type: layers", "  layers:"]
        lines += [f"    - {l.replace('ACT', act)}" for l in RMS_LAYERS]
    else:  # gpt: act holds the case's model keys
        lines = ["model:", "  type: gpt"] + [f"  {k}: {v}" for k, v in {**GPT_MODEL, **act}.items()]
        lines += ["data:", f"  seq_len: {GPT_SEQ}"]
    lines += ["train:", "  seed: 5", "  optimizer:", f"    name: {opt}"]
    lines += [f"    {k}: {v}" for k, v in hp.items()]
    lines += ["  schedule:", "    name: constant", "    warmup_steps: 0"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_layout(path):
    """(name, offset, group, shape) per tensor; group "buffer" for buffers."""
    out = []
    with open(path) as f:
        for line in f:
            name, off, group, *dims = line.split()
            out.append((name, int(off), group, tuple(int(d) for d in dims)))
    return out


def flat_view(flat, entry):
    _, off, _, shape = entry
    n = int(np.prod(shape))
    return torch.from_numpy(flat[off:off + n].copy()).view(*shape)


def tensor_of(model, name):
    """The torch tensor of a dtrain name; a GPT's h<i>.x is h.<i>.x here."""
    name = re.sub(r"^h(\d+)\.", r"h.\1.", name)
    mod, attr = name.rsplit(".", 1)
    return getattr(model.get_submodule(mod), attr)


def rel_err(a, b):
    scale = max(float(b.abs().max()), 1e-12)
    return float((a - b).abs().max()) / scale


def run_case(driver, work, kind, opt, act, hp, x, y, tag=None):
    """One case: kind mlp or cnn (act: the activation, x images, y
    classes), or gpt (act: the model keys, x token ids, y next tokens)."""
    tag = tag or f"{kind}-{opt}-{act}"
    out = os.path.join(work, tag)
    os.makedirs(out, exist_ok=True)
    job = os.path.join(out, "job.yaml")
    write_job(job, kind, opt, act, hp)
    prefix = "gpt_" if kind == "gpt" else ""
    cmd = [driver, job, os.path.join(work, prefix + "x.bin"), os.path.join(work, prefix + "y.bin"),
           str(len(x)), out, str(STEPS)]
    if kind == "gpt":
        cmd += [str(GPT_SEQ), str(GPT_VOCAB)]
    if tag in WIDE:  # the layout and initial weights first, then the steps from wider ones
        subprocess.run(cmd[:6] + ["0"] + cmd[7:], check=True)
        layout = [e for e in read_layout(os.path.join(out, "layout.txt")) if e[2] != "buffer"]
        start = os.path.join(out, "start.bin")
        widen(layout, np.fromfile(os.path.join(out, "params0.bin"), dtype=np.float32)).tofile(start)
        cmd.append(start)
    subprocess.run(cmd, check=True)
    entries = read_layout(os.path.join(out, "layout.txt"))
    layout = [e for e in entries if e[2] != "buffer"]
    buffers = [e for e in entries if e[2] == "buffer"]
    load = lambda name: np.fromfile(os.path.join(out, name), dtype=np.float32)

    if kind == "gpt":
        vocab = max(GPT_VOCAB, int(act["vocab_size"]))
        model = TorchGPT(vocab, GPT_SEQ, GPT_MODEL["n_embd"], GPT_MODEL["n_layer"],
                         GPT_MODEL["n_head"], act["tie_embeddings"] == "true",
                         act.get("norm") == "rmsnorm")
        forward = lambda: model(x).view(-1, vocab)
        target = y.reshape(-1)
    else:
        model = {"mlp": lambda: TorchMLP(act), "rms": lambda: TorchRMSMLP(act),
                 "cnn": TorchCNN}[kind]()
        forward, target = lambda: model(x), y
    model.train()
    params0 = load("params0.bin")
    tparams = {}
    with torch.no_grad():
        for entry in layout:
            p = tensor_of(model, entry[0])
            if tuple(p.shape) != entry[3]:
                return [f"{tag}: {entry[0]} has shape {entry[3]} in dtrain, "
                        f"{tuple(p.shape)} in torch"]
            p.copy_(flat_view(params0, entry))
            tparams[entry[0]] = p
    if len(tparams) != len(list(model.parameters())):
        return [f"{tag}: dtrain has {len(tparams)} parameter tensors, torch "
                f"{len(list(model.parameters()))}"]
    decay = {"weight": hp["weight_decay"], "bias": hp.get("bias_weight_decay", 0.0),
             "norm": hp.get("norm_weight_decay", 0.0)}
    groups = [{"params": [tparams[e[0]] for e in layout if e[2] == g], "weight_decay": wd}
              for g, wd in decay.items()]
    groups = [g for g in groups if g["params"]]
    if opt == "sgd":
        topt = torch.optim.SGD(groups, lr=hp["lr"], momentum=hp["momentum"],
                               nesterov=hp["nesterov"] == "true")
    else:
        topt = torch.optim.AdamW(groups, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                 eps=hp["eps"])
    failures = []
    for k in range(1, STEPS + 1):
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(), target)
        loss.backward()
        dloss = float(open(os.path.join(out, f"loss_{k}.txt")).read())
        e = abs(dloss - loss.item()) / abs(loss.item())
        if e > LOSS_TOL:
            failures.append(f"{tag} step {k}: loss dtrain {dloss:.8g} torch {loss.item():.8g}")
        grads, params = load(f"grads_{k}.bin"), None
        worst_g = 0.0
        for entry in layout:
            e = rel_err(flat_view(grads, entry), tparams[entry[0]].grad)
            worst_g = max(worst_g, e)
            if e > GRAD_TOL:
                failures.append(f"{tag} step {k}: gradient of {entry[0]} differs by {e:.3g}")
        # The step itself is checked on identical gradients, so that the
        # optimizer is measured, not the last bits of two GEMM libraries
        # (AdamW divides by sqrt(v) + eps and magnifies those bits where a
        # gradient is near eps).
        with torch.no_grad():
            for entry in layout:
                tparams[entry[0]].grad.copy_(flat_view(grads, entry))
        topt.step()
        params = load(f"params_{k}.bin")
        worst_p = 0.0
        for entry in layout:
            e = rel_err(flat_view(params, entry), tparams[entry[0]].detach())
            worst_p = max(worst_p, e)
            if e > PARAM_TOL:
                failures.append(f"{tag} step {k}: {entry[0]} after the step differs by {e:.3g}")
        bufs = load(f"buffers_{k}.bin")
        for entry in buffers:
            e = rel_err(flat_view(bufs, entry), tensor_of(model, entry[0]).detach())
            if e > PARAM_TOL:
                failures.append(f"{tag} step {k}: buffer {entry[0]} differs by {e:.3g}")
        print(f"{tag:18s} step {k}: loss {dloss:.6f} (torch {loss.item():.6f}), "
              f"worst gradient rel err {worst_g:.2e}, worst parameter rel err {worst_p:.2e}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(ROWS, SIDE, SIDE, dtype=torch.float32)
    y = torch.randint(0, CLASSES, (ROWS,), dtype=torch.int64)
    x.numpy().tofile(os.path.join(args.workdir, "x.bin"))
    y.to(torch.int32).numpy().tofile(os.path.join(args.workdir, "y.bin"))
    # windows of GPT_SEQ + 1 tokens: the input and the next tokens
    tokens = torch.randint(0, GPT_VOCAB, (GPT_ROWS, GPT_SEQ + 1), dtype=torch.int64)
    gx, gy = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    gx.to(torch.float32).numpy().tofile(os.path.join(args.workdir, "gpt_x.bin"))
    gy.to(torch.int32).numpy().tofile(os.path.join(args.workdir, "gpt_y.bin"))
    failures = []
    for kind, opt, act, hp in CASES:
        failures += run_case(args.driver, args.workdir, kind, opt, act, hp, x, y)
    for tag, keys in GPT_CASES:
        failures += run_case(args.driver, args.workdir, "gpt", "adamw", keys, GPT_HP, gx, gy,
                             tag=tag)
    # Recomputation must not change a bit of the gradients (and must happen).
    arena = {}
    for tag in ("gpt-tied", "gpt-recompute"):
        with open(os.path.join(args.workdir, tag, "arena.txt")) as f:
            arena[tag] = [int(v) for v in f.read().split()]
    if not arena["gpt-recompute"][0] < arena["gpt-recompute"][1] == arena["gpt-tied"][0]:
        failures.append(f"gpt-recompute: activation arena {arena['gpt-recompute'][0]} bytes "
                        f"(without recomputation {arena['gpt-recompute'][1]}, gpt-tied "
                        f"{arena['gpt-tied'][0]}): model.recompute all dropped nothing")
    for k in range(1, STEPS + 1):
        name = f"grads_{k}.bin"
        with open(os.path.join(args.workdir, "gpt-tied", name), "rb") as f:
            plain = f.read()
        with open(os.path.join(args.workdir, "gpt-recompute", name), "rb") as f:
            again = f.read()
        if plain != again:
            failures.append(f"gpt-recompute step {k}: gradients differ from gpt-tied's "
                            "(model.recompute all must give identical gradients)")
    ncases = len(CASES) + len(GPT_CASES)
    for f in failures:
        print("MISMATCH:", f)
    print(f"torch_compare: {ncases} cases x {STEPS} steps, {len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
