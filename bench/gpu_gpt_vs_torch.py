#!/usr/bin/env python3
"""PyTorch side of the GPT benchmark: a GPT-2-style language model trained on
one GPU, timed, and reported as one JSON line on stdout (everything else goes
to stderr):

  {"side": "torch", "model": "gpt", "tokens_per_s": X, ...}

  gpu_gpt_vs_torch.py --batch B [--seq 1024] [--layers 12] [--heads 12]
                      [--dim 768] [--vocab 50257] [--precision bf16|fp32]
                      [--compile] [--target-s 10] [--device cuda|cpu] ...

The default shape is GPT-2 small (12 layers, 12 heads, width 768, vocabulary
50257, context 1024, 124M parameters with the token embedding tied to the
output layer). Each block is pre-norm: x += proj(attn(ln1(x))), x +=
fc2(gelu(fc1(ln2(x)))), with a fused qkv projection (3 x width), causal
F.scaled_dot_product_attention (PyTorch picks its flash or memory-efficient
kernel), exact (erf) GELU as dtrain's gelu op, biases on every linear layer,
a final LayerNorm, and cross-entropy over the vocabulary. Dropout is 0 by
default (--dropout to change).

Training: AdamW (fused where PyTorch has it; lr 6e-4, betas 0.9/0.95,
weight decay 0.1 on every 2-D weight, the embeddings included, none on
biases and norms, as dtrain's parameter groups for a GPT); --precision
bf16 (default) is torch.autocast(bfloat16) around forward and loss with
fp32 parameters and optimizer state, as dtrain's train.precision=bf16;
fp32 lets matmuls use TF32 unless --no-tf32. --compile wraps the model in torch.compile (the
compile time falls in the warm-up, not in the figure).

PyTorch gets its best case for data: the tokens are random ids made once on
the GPU (throughput does not depend on their values), so nothing is read or
copied inside the timed loop and the loss is never copied to the host
there. After --warmup steps the number of timed steps is chosen to fill
about --target-s seconds, timed with torch.cuda.synchronize() on both ends.

tokens_per_s counts batch x seq tokens per optimizer step. The JSON also
gives the step time, parameter count, peak memory and model FLOPs
utilisation: flops_per_token = 6 * (the parameters less the two embedding
tables, plus vocab x width for the output layer, tied or not) +
12 * layers * seq * width (forward and backward, attention scores and
values counted in full as in the PaLM paper's appendix B; causal masking
halves the real work there), mfu against --peak-tflops (default 989, the
H100/H200 SXM dense bf16 datasheet figure).

--device cpu runs the same code on the CPU (fp32), only to try
the script out on a small shape. Exit status: 0 measured; 1 the run failed
(out of memory included: the JSON line then has "error"); 64 bad usage.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

PROBE_STEPS = 3
MIN_STEPS, MAX_STEPS = 5, 10000
EX_USAGE = 64


class Block(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        # (B, T, 3, H, Dh): the layout of dtrain's attention op, then (B, H, T, Dh) views
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(B, T, C)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab, seq, dim, heads, layers, dropout, tie):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.head.weight = self.wte.weight
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def adamw(model, lr, weight_decay, fused):
    """Decay on every 2-D weight (embeddings included), none on biases and
    norms; a tied output weight is counted once."""
    params = list(dict((id(p), p) for p in model.parameters()).values())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused), fused
    except (TypeError, RuntimeError):  # PyTorch without a fused AdamW
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95)), False


def count_params(model):
    return sum(p.numel() for p in dict((id(p), p) for p in model.parameters()).values())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # sysexits' usage code, not argparse's 2
        self.print_usage(sys.stderr)
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(EX_USAGE)


def parse_args():
    p = Parser(description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, required=True, help="sequences per step")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--untied", action="store_true", help="a separate output weight")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="fp32 matmuls without TF32")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first (default 5, 20 with --compile)")
    p.add_argument("--target-s", type=float, default=10.0, help="seconds of timed steps")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    if min(a.batch, a.seq, a.layers, a.heads, a.dim, a.vocab) < 1 or a.dim % a.heads:
        p.error(f"sizes must be >= 1 and --dim ({a.dim}) a multiple of --heads ({a.heads})")
    if a.warmup is None:
        a.warmup = 20 if a.compile else 5
    return a


def run(a, device, record):
    torch.manual_seed(a.seed)
    model = GPT(a.vocab, a.seq, a.dim, a.heads, a.layers, a.dropout, not a.untied).to(device)
    n_params = count_params(model)
    n_emb = model.wte.weight.numel() + model.wpe.weight.numel()
    opt, fused = adamw(model, a.lr, a.weight_decay, device.type == "cuda")
    fwd = torch.compile(model) if a.compile else model
    gen = torch.Generator(device=device).manual_seed(a.seed)
    # one spare token per sequence: targets are the inputs shifted by one
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=device, generator=gen)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    bf16 = a.precision == "bf16"
    record.update(params=n_params, fused_adamw=fused)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        return loss

    def timed(n):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync(device)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
    sync(device)
    warm_s = time.perf_counter() - t0
    first_loss = float(loss.detach()) if a.warmup else float("nan")
    probe = timed(PROBE_STEPS) / PROBE_STEPS
    steps = int(min(MAX_STEPS, max(MIN_STEPS, a.target_s / max(probe, 1e-9))))
    seconds = timed(steps)

    tokens = a.batch * a.seq
    flops_per_token = 6 * (n_params - n_emb) + 12 * a.layers * a.seq * a.dim
    if not a.untied:  # the output layer's matmul uses the tied embedding
        flops_per_token += 6 * model.wte.weight.numel()
    tps = steps * tokens / seconds
    record.update(steps=steps, seconds=round(seconds, 4), warmup_s=round(warm_s, 2),
                  step_ms=round(1e3 * seconds / steps, 3), tokens_per_s=round(tps, 1),
                  flops_per_token=flops_per_token,
                  tflops=round(tps * flops_per_token / 1e12, 2),
                  mfu=round(tps * flops_per_token / (a.peak_tflops * 1e12), 4),
                  loss_after_warmup=None if math.isnan(first_loss) else round(first_loss, 4))
    if device.type == "cuda":
        record["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def main():
    a = parse_args()
    device = torch.device(a.device)
    if device.type == "cpu":
        a.precision = "fp32"
    record = {"side": "torch", "model": "gpt", "layers": a.layers, "heads": a.heads,
              "dim": a.dim, "vocab": a.vocab, "seq": a.seq, "batch": a.batch,
              "precision": a.precision,
              "tf32": a.tf32 and a.precision == "fp32" and device.type == "cuda",
              "compile": a.compile, "torch": torch.__version__}
    if device.type == "cuda":
        if not torch.cuda.is_available():
            record["error"] = "no CUDA device visible to PyTorch"
            print(json.dumps(record), flush=True)
            return 1
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        record["device"] = torch.cuda.get_device_name(device)
    else:
        record["device"] = "cpu"
    try:
        run(a, device, record)
    except torch.cuda.OutOfMemoryError as e:
        record["error"] = "out of memory: " + str(e).split("\n")[0]
        print(json.dumps(record), flush=True)
        return 1
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
