#!/usr/bin/env python3
"""PyTorch side of bench/gpt_vs_torch.sh: the GPT of a dtrain job of
model.type gpt (n_layer, n_head, n_embd, the vocabulary, tied head or
not, dropout 0) on the same token file, windows, batch and AdamW with
dtrain's parameter groups (weight decay on 2-D weights, embeddings
included), trained for a fixed number of steps on the given thread count.
Prints 'torch_tokens_per_s X'.

Usage: torch_gpt.py H5 STEPS THREADS BATCH SEQ_LEN N_LAYER N_HEAD N_EMBD VOCAB TIED LR WD
[CLIP] (VOCAB: model.vocab_size, 0 for the file's; TIED: true or false;
CLIP: train.clip_norm, clipping by global norm when above 0). The
model is GPT-2's layout as dtrain builds it (pre-norm blocks, fused qkv,
exact GELU, learned positions, head without bias), with PyTorch's fused
causal attention (F.scaled_dot_product_attention) where the PyTorch has
it (2.0 on), else the scores masked and softmaxed explicitly. Like dtrain's figure,
the time covers the training steps only (5 warm-up steps first); the
batches are random windows of SEQ_LEN + 1 tokens of the train split, read
once into memory.
"""
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_mlp import adamw_groups


class Block(nn.Module):
    def __init__(self, c, heads, seq):
        super().__init__()
        self.heads = heads
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0
            s = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
            s = s.masked_fill(self.mask[:t, :t], float("-inf"))
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, c, layers, heads, tied):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        self.h = nn.ModuleList([Block(c, heads, seq) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("proj.weight", "fc2.weight")) \
                    else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    a = sys.argv
    path, steps, threads, batch, seq = a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5])
    layers, heads, width, vocab = int(a[6]), int(a[7]), int(a[8]), int(a[9])
    tied, lr, wd = a[10] == "true", float(a[11]), float(a[12])
    clip = float(a[13]) if len(a) > 13 else 0.0
    torch.set_num_threads(threads)
    with h5py.File(path, "r") as f:
        vocab = max(vocab, int(f.attrs["vocab_size"]))
        tokens = torch.from_numpy(f["train/tokens"][:].astype(np.int64))
    torch.manual_seed(42)
    model = GPT(vocab, seq, width, layers, heads, tied)
    opt = adamw_groups(model, lr, wd)
    gen = torch.Generator().manual_seed(42)
    offsets = torch.arange(seq + 1)
    warm = 5
    model.train()
    for i in range(steps + warm):
        if i == warm:
            t0 = time.perf_counter()
        start = torch.randint(0, len(tokens) - seq - 1, (batch, 1), generator=gen)
        w = tokens[start + offsets]
        x, y = w[:, :-1], w[:, 1:]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(-1, vocab), y.reshape(-1))
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    dt = time.perf_counter() - t0
    print(f"torch_tokens_per_s {steps * batch * seq / dt:.1f}")
    print(f"torch_final_loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
