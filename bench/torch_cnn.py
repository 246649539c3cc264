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
import sys

import torch
import torch.nn as nn

from torch_mlp import adamw_groups, load_train, samples_per_s


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
    x, y = load_train(root)
    model = build(kind, channels, blocks, hidden, dropout)
    opt = adamw_groups(model, 2e-3, 0.05)
    print(f"torch_samples_per_s {samples_per_s(model, opt, x.unsqueeze(1), y, steps, batch):.1f}")


if __name__ == "__main__":
    main()
