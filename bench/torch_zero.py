#!/usr/bin/env python3
"""PyTorch side of bench/shard.sh: the same GPT (torch_gpt.py's, dropout
0, tied head) trained by WORLD processes over gloo on the loopback
interface: with DistributedDataParallel and AdamW replicated on every rank
(ddp) or split by torch.distributed.optim.ZeroRedundancyOptimizer (zero:
the optimizer state sharded, as comm.shard: optimizer does), or with
FullyShardedDataParallel on the CPU, each transformer block its own unit,
sharding the gradients and the optimizer state (fsdp_grad:
SHARD_GRAD_OP, as comm.shard: gradients does) or the parameters too
(fsdp_full: FULL_SHARD). Each rank takes its slice
of a global batch of random windows. Prints, for the run,
'torch_peak_rss_mib X' (the largest rank's peak resident size,
getrusage) and 'torch_tokens_per_s X' (aggregate, training steps only,
after 2 warm-up steps).

Usage: torch_zero.py H5 STEPS WORLD GLOBAL_BATCH SEQ N_LAYER N_HEAD N_EMBD ddp|zero|fsdp_grad|fsdp_full
"""
import os
import resource
import socket
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from torch_gpt import GPT, Block

WARMUP = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port, out):
    path, steps, world, gbatch, seq = a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4])
    layers, heads, width, how = int(a[5]), int(a[6]), int(a[7]), a[8]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with h5py.File(path, "r") as f:
        vocab = int(f.attrs["vocab_size"])
        tokens = torch.from_numpy(f["train/tokens"][:].astype(np.int64))
    torch.manual_seed(42)
    gpt = GPT(vocab, seq, width, layers, heads, True)
    if how.startswith("fsdp"):
        import functools
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        model = FSDP(gpt, device_id=torch.device("cpu"), sync_module_states=False,
                     auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                        transformer_layer_cls={Block}),
                     sharding_strategy=ShardingStrategy.SHARD_GRAD_OP if how == "fsdp_grad"
                     else ShardingStrategy.FULL_SHARD)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    else:
        # the causal masks are the same constant everywhere; gloo cannot broadcast bool
        ddp = torch.nn.parallel.DistributedDataParallel
        ddp._set_params_and_buffers_to_ignore_for_model(
            gpt, [n for n, _ in gpt.named_buffers() if n.endswith("mask")])
        model = ddp(gpt)
    if how.startswith("fsdp"):
        pass
    elif how == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=3e-4, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    per_rank = gbatch // world
    gen = torch.Generator().manual_seed(42 + rank)
    offsets = torch.arange(seq + 1)
    for i in range(steps + WARMUP):
        if i == WARMUP:
            dist.barrier()
            t0 = time.perf_counter()
        start = torch.randint(0, len(tokens) - seq - 1, (per_rank, 1), generator=gen)
        w = tokens[start + offsets]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(w[:, :-1]).reshape(-1, vocab), w[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put((rss.item(), steps * gbatch * seq / dt))
    dist.destroy_process_group()


def main():
    a = sys.argv[1:]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(worker, args=(a, free_port(), out), nprocs=int(a[2]), join=True)
    rss, tps = out.get()
    print(f"torch_peak_rss_mib {rss:.0f}")
    print(f"torch_tokens_per_s {tps:.1f}")


if __name__ == "__main__":
    main()
