#!/usr/bin/env python3
"""PyTorch side of bench/gpu_vs_torch.sh: the MLP of configs/fashion-mnist-mlp.yaml
(Flatten, Linear + ReLU + Dropout(0.1) per hidden layer, Linear to 10 classes,
cross-entropy, AdamW lr 1e-3 weight decay 0.01) trained on one GPU, for each
configuration given, in one process. Prints one line per configuration:

  torch hidden=512,512 batch=128 precision=fp32 steps=N seconds=S samples_per_s=X

  torch_gpu_mlp.py DATA.h5 HIDDEN:BATCH:PRECISION [...]    e.g. 512,512:128:bf16

PyTorch gets its best case: the training split is read once from dtrain's
HDF5 dataset (h5py), normalised as dtrain does ((v * norm_scale - norm_mean)
/ norm_std) and kept in GPU memory, so batches are gathers on the GPU with a
per-epoch permutation; AdamW is the fused CUDA one; the loss is never copied
to the host inside the timed loop. fp32 lets matmuls use TF32 (as dtrain's
runtime.allow_tf32=true); bf16 is torch.autocast(bfloat16) with fp32
parameters and optimizer state (as dtrain's train.precision=bf16). After a
warm-up the number of timed steps is chosen to fill about TARGET_S seconds
(environment, default 1.5), timed with torch.cuda.synchronize() on both ends.
--device cpu runs the same code on the CPU, only to try the script out.
"""
import os
import sys
import time

import h5py
import numpy as np
import torch

WARMUP_STEPS = 30
PROBE_STEPS = 20
MIN_STEPS, MAX_STEPS = 50, 20000


def load(path, device):
    with h5py.File(path, "r") as f:
        x = f["train/x"][...]
        y = f["train/y"][...]
        scale, mean, std = (float(f.attrs[k]) for k in ("norm_scale", "norm_mean", "norm_std"))
    x = torch.from_numpy(x.reshape(len(x), -1)).to(device).float()
    x = (x * scale - mean) / std
    y = torch.from_numpy(y.astype(np.int64)).to(device)
    return x, y


def build(hidden, inputs, classes, device):
    layers, width = [torch.nn.Flatten()], inputs
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU(), torch.nn.Dropout(0.1)]
        width = h
    layers.append(torch.nn.Linear(width, classes))
    model = torch.nn.Sequential(*layers).to(device)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                                fused=device.type == "cuda")
    except (TypeError, RuntimeError):  # PyTorch without a fused AdamW
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return model, opt


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(x, y, hidden, batch, precision, device, target_s):
    torch.manual_seed(42)
    model, opt = build(hidden, x.shape[1], int(y.max()) + 1, device)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device=device).manual_seed(42)
    per_epoch = len(x) // batch
    state = {"perm": None, "b": per_epoch}

    def step():
        if state["b"] == per_epoch:
            state["perm"], state["b"] = torch.randperm(len(x), device=device, generator=gen), 0
        idx = state["perm"][state["b"] * batch:(state["b"] + 1) * batch]
        state["b"] += 1
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()

    def timed(n):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync(device)
        return time.perf_counter() - t0

    for _ in range(WARMUP_STEPS):
        step()
    probe = timed(PROBE_STEPS) / PROBE_STEPS
    steps = int(min(MAX_STEPS, max(MIN_STEPS, target_s / max(probe, 1e-9))))
    seconds = timed(steps)
    return steps, seconds


def main():
    args = sys.argv[1:]
    device = torch.device("cuda")
    if len(args) >= 2 and args[0] == "--device":
        device = torch.device(args[1])
        args = args[2:]
    if len(args) < 2:
        sys.exit(__doc__)
    path, configs = args[0], args[1:]
    target_s = float(os.environ.get("TARGET_S", "1.5"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu"
    print(f"torch_info version={torch.__version__} device={name.replace(' ', '_')}", flush=True)
    x, y = load(path, device)
    for c in configs:
        hidden_s, batch_s, precision = c.split(":")
        hidden = [int(h) for h in hidden_s.split(",")]
        batch = int(batch_s)
        steps, seconds = bench(x, y, hidden, batch, precision, device, target_s)
        print(f"torch hidden={hidden_s} batch={batch} precision={precision} steps={steps} "
              f"seconds={seconds:.4f} samples_per_s={steps * batch / seconds:.1f}", flush=True)


if __name__ == "__main__":
    main()
