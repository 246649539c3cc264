#!/usr/bin/env python3
"""PyTorch DistributedDataParallel (gloo) side of bench/scaling.sh: the
quick-start MLP (784-512-512-10, dropout 0.1, AdamW) with the same global
batch split over WORLD processes of THREADS threads each, on the loopback
interface. Prints 'ddp_samples_per_s X' (aggregate, training steps only).
   torch_ddp.py IDX_DIR STEPS WORLD THREADS GLOBAL_BATCH
"""
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WARMUP = 20


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def worker(rank, root, steps, world, threads, gbatch, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = read_idx(f"{root}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = read_idx(f"{root}/train-labels-idx1-ubyte.gz").astype(np.int64)
    x = torch.from_numpy((x - x.mean()) / x.std())
    y = torch.from_numpy(y)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(512, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_rank = gbatch // world
    per_epoch = len(x) // gbatch
    gen = torch.Generator().manual_seed(42)
    perm, b = torch.randperm(len(x), generator=gen), 0
    for i in range(steps + WARMUP):
        if i == WARMUP:
            dist.barrier()
            t0 = time.perf_counter()
        if b == per_epoch:
            perm, b = torch.randperm(len(x), generator=gen), 0
        idx = perm[b * gbatch + rank * per_rank:b * gbatch + (rank + 1) * per_rank]
        b += 1
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x[idx]), y[idx])
        loss.backward()
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        out.put(steps * gbatch / dt)
    dist.destroy_process_group()


def main():
    root, steps, world, threads, gbatch = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                           int(sys.argv[4]), int(sys.argv[5]))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, root, steps, world, threads, gbatch, port, q))
             for r in range(world)]
    for p in procs:
        p.start()
    sps = q.get()
    for p in procs:
        p.join()
    print(f"ddp_samples_per_s {sps:.1f}")


if __name__ == "__main__":
    main()
