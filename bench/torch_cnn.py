#!/usr/bin/env python3
"""PyTorch side of bench/cnn_vs_torch.sh: the model of a dtrain job of
model.type cnn or resnet (channels, blocks, hidden, dropout as the job's
--print-config gives them), the same data, batch and AdamW with dtrain's
parameter groups (weight decay on weights only), trained for a fixed
number of steps on the given thread count. Prints 'torch_samples_per_s X'.

Usage: torch_cnn.py IDX_DIR STEPS THREADS BATCH TYPE CHANNELS BLOCKS HIDDEN DROPOUT
(lists comma-separated). Like dtrain's figure, the time covers the
training steps only (20 warm-up steps first).
"""
import gzip
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return torch.relu(h + (self.proj(x) if self.proj is not None else x))


def build(kind, channels, blocks, hidden, dropout):
    layers, c, side = [], 1, 28
    if kind == "cnn":
        for ch in channels:
            layers += [nn.Conv2d(c, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(),
                       nn.MaxPool2d(2)]
            c, side = ch, side // 2
        layers.append(nn.Flatten())
        d = c * side * side
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            d = h
        layers.append(nn.Linear(d, 10))
    else:
        layers += [nn.Conv2d(1, channels[0], 3, padding=1, bias=False),
                   nn.BatchNorm2d(channels[0]), nn.ReLU()]
        c = channels[0]
        for s, (ch, nb) in enumerate(zip(channels, blocks)):
            for b in range(nb):
                layers.append(Block(c, ch, 2 if s > 0 and b == 0 else 1))
                c = ch
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)]
    return nn.Sequential(*layers)


def main():
    root, steps, threads, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    kind = sys.argv[5]
    ints = lambda s: [int(v) for v in s.split(",") if v]
    channels, blocks, hidden = ints(sys.argv[6]), ints(sys.argv[7]), ints(sys.argv[8])
    dropout = float(sys.argv[9])
    torch.set_num_threads(threads)
    x = read_idx(f"{root}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = read_idx(f"{root}/train-labels-idx1-ubyte.gz").astype(np.int64)
    x = torch.from_numpy((x - x.mean()) / x.std()).unsqueeze(1)
    y = torch.from_numpy(y)
    model = build(kind, channels, blocks, hidden, dropout)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    other = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": other, "weight_decay": 0.0}], lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
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
    dt = time.perf_counter() - t0
    print(f"torch_samples_per_s {steps * batch / dt:.1f}")


if __name__ == "__main__":
    main()
