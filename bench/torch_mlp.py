#!/usr/bin/env python3
"""PyTorch side of bench/mlp_vs_torch.sh: the same MLP, data, batch,
optimizer and dropout as configs/fashion-mnist-mlp.yaml, trained for a fixed
number of steps on the given thread count. Prints 'torch_samples_per_s X'.

The data is read once from the IDX files into memory (numpy), normalised
like dtrain's importer, and shuffled each epoch; like dtrain's figure, the
time covers the training steps only.
"""
import gzip
import struct
import sys
import time

import numpy as np
import torch


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_train(root):
    """Fashion-MNIST's training images (normalised like dtrain's importer,
    shape (N, 28, 28)) and labels, as tensors."""
    x = read_idx(f"{root}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = read_idx(f"{root}/train-labels-idx1-ubyte.gz").astype(np.int64)
    return torch.from_numpy((x - x.mean()) / x.std()), torch.from_numpy(y)


def adamw_groups(model, lr, weight_decay):
    """AdamW with dtrain's parameter groups: weight decay on the weight
    matrices and kernels only."""
    decay = [p for p in model.parameters() if p.dim() > 1]
    other = [p for p in model.parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=lr)


def samples_per_s(model, opt, x, y, steps, batch):
    """Trains for 20 warm-up steps and then `steps` timed ones on batches
    drawn from a per-epoch shuffle; returns the timed steps' samples/s."""
    loss_fn = torch.nn.CrossEntropyLoss()
    per_epoch = len(x) // batch
    gen = torch.Generator().manual_seed(42)

    def batches():
        while True:
            perm = torch.randperm(len(x), generator=gen)
            for b in range(per_epoch):
                idx = perm[b * batch:(b + 1) * batch]
                yield x[idx], y[idx]

    it = batches()
    warm = 20
    model.train()
    for i in range(steps + warm):
        if i == warm:
            t0 = time.perf_counter()
        xb, yb = next(it)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - t0)


def main():
    root, steps, threads, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    x, y = load_train(root)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(512, 10))
    opt = adamw_groups(model, 1e-3, 0.01)
    print(f"torch_samples_per_s {samples_per_s(model, opt, x, y, steps, batch):.1f}")


if __name__ == "__main__":
    main()
