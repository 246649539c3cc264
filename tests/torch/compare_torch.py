#!/usr/bin/env python3
"""dtrain against PyTorch on the same MLP, weights and batch.

For SGD (momentum, Nesterov, weight decay) and AdamW, and for each
activation, torch_step runs dtrain's model for a few optimizer steps on one
batch; this script loads dtrain's initial weights into an identical
torch.nn model, repeats the steps with torch.optim, and checks:
  - the loss matches within 1e-4 relative, every step;
  - every parameter gradient matches within 1e-4 relative to the tensor's
    largest gradient, every step;
  - the parameters after each optimizer step, taken from the same
    gradients on both sides, match within 1e-5 relative to the tensor's
    largest value.
Exit 0 when all match, 1 on a mismatch, 77 (skipped) without PyTorch.
"""
import argparse
import os
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
    ("sgd", "relu", {"lr": 0.05, "momentum": 0.9, "nesterov": "false", "weight_decay": 0.01}),
    ("sgd", "tanh", {"lr": 0.05, "momentum": 0.9, "nesterov": "true", "weight_decay": 0.001}),
    ("adamw", "gelu", {"lr": 0.001, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999,
                       "eps": 1e-8}),
    ("adamw", "relu", {"lr": 0.003, "weight_decay": 0.1, "beta1": 0.8, "beta2": 0.99,
                       "eps": 1e-6}),
]


def write_job(path, opt, act, hp):
    lines = ["model:", "  type: mlp", f"  hidden: [{', '.join(map(str, HIDDEN))}]",
             f"  activation: {act}", "  dropout: 0", "  init: kaiming",
             "train:", "  seed: 5", "  optimizer:", f"    name: {opt}"]
    lines += [f"    {k}: {v}" for k, v in hp.items()]
    lines += ["  schedule:", "    name: constant", "    warmup_steps: 0"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def torch_model(act):
    acts = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "gelu": torch.nn.GELU}
    layers, dim = [torch.nn.Flatten()], SIDE * SIDE
    for h in HIDDEN:
        layers += [torch.nn.Linear(dim, h), acts[act]()]
        dim = h
    layers.append(torch.nn.Linear(dim, CLASSES))
    return torch.nn.Sequential(*layers)


def named_linears(model):
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    return {f"fc{i + 1}": lin for i, lin in enumerate(linears)}


def read_layout(path):
    out = []
    with open(path) as f:
        for line in f:
            name, off, r, c = line.split()
            out.append((name, int(off), int(r), int(c)))
    return out


def flat_view(flat, entry):
    _, off, r, c = entry
    n = r * c if c else r
    t = torch.from_numpy(flat[off:off + n].copy())
    return t.view(r, c) if c else t


def rel_err(a, b):
    scale = max(float(b.abs().max()), 1e-12)
    return float((a - b).abs().max()) / scale


def run_case(driver, work, opt, act, hp, x, y):
    tag = f"{opt}-{act}"
    out = os.path.join(work, tag)
    os.makedirs(out, exist_ok=True)
    job = os.path.join(out, "job.yaml")
    write_job(job, opt, act, hp)
    subprocess.run([driver, job, os.path.join(work, "x.bin"), os.path.join(work, "y.bin"),
                    str(ROWS), out, str(STEPS)], check=True)
    layout = read_layout(os.path.join(out, "layout.txt"))
    load = lambda name: np.fromfile(os.path.join(out, name), dtype=np.float32)

    model = torch_model(act)
    lin = named_linears(model)
    params0 = load("params0.bin")
    tparams = {}
    with torch.no_grad():
        for entry in layout:
            layer, kind = entry[0].split(".")
            p = getattr(lin[layer], kind)
            p.copy_(flat_view(params0, entry))
            tparams[entry[0]] = p
    if opt == "sgd":
        topt = torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=hp["momentum"],
                               nesterov=hp["nesterov"] == "true", weight_decay=hp["weight_decay"])
    else:
        topt = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                 eps=hp["eps"], weight_decay=hp["weight_decay"])
    failures = []
    for k in range(1, STEPS + 1):
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
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
        print(f"{tag:12s} step {k}: loss {dloss:.6f} (torch {loss.item():.6f}), "
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
    failures = []
    for opt, act, hp in CASES:
        failures += run_case(args.driver, args.workdir, opt, act, hp, x, y)
    for f in failures:
        print("MISMATCH:", f)
    print(f"torch_compare: {len(CASES)} cases x {STEPS} steps, {len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
