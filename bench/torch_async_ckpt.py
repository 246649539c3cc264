#!/usr/bin/env python3
"""PyTorch side of bench/ckpt_async.sh: the same GPT (torch_gpt.py's,
dropout 0, tied head) trained by 2 processes over gloo with
DistributedDataParallel and AdamW, saving its model and optimizer state
every EVERY steps with torch.distributed.checkpoint: save (sync), or
async_save (async: the state staged in host memory, then written by a
background thread over a process group of its own, the next save waiting
for the one before), or not at all (none). Each rank takes its slice of a
global batch of random windows. Prints, for the run:
  'torch_loop_s X'        the training loop's wall time (rank 0)
  'torch_blocked_s A B ...' per save, how long the loop was blocked
                          (the save call, and for async the wait for the
                          save before it)
  'torch_write_s A B ...' per save, from its start to its files written

Usage: torch_async_ckpt.py H5 DIR STEPS EVERY GLOBAL_BATCH SEQ N_LAYER N_HEAD N_EMBD none|sync|async
"""
import os
import socket
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn.functional as F

from torch_gpt import GPT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port, out):
    path, ckdir, steps, every = a[0], a[1], int(a[2]), int(a[3])
    gbatch, seq, layers, heads, width, how = int(a[4]), int(a[5]), int(a[6]), int(a[7]), int(a[8]), a[9]
    world = 2
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    side = dist.new_group(backend="gloo") if how == "async" else None
    with h5py.File(path, "r") as f:
        vocab = int(f.attrs["vocab_size"])
        tokens = torch.from_numpy(f["train/tokens"][:].astype(np.int64))
    torch.manual_seed(42)
    model = torch.nn.parallel.DistributedDataParallel(GPT(vocab, seq, width, layers, heads, True))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    per = gbatch // world
    g = torch.Generator().manual_seed(1234)
    blocked, written, pending = [], [], None
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        starts = torch.randint(0, len(tokens) - seq - 1, (gbatch,), generator=g)[rank * per:(rank + 1) * per]
        x = torch.stack([tokens[s:s + seq] for s in starts])
        y = torch.stack([tokens[s + 1:s + seq + 1] for s in starts])
        loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if how == "none" or step % every:
            continue
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        where = f"{ckdir}/step{step}"
        b0 = time.perf_counter()
        if how == "sync":
            dcp.save(state, checkpoint_id=where)
            written.append(time.perf_counter() - b0)
        else:
            if pending is not None:
                pending[0].result()
                written.append(time.perf_counter() - pending[1])
            pending = (dcp.async_save(state, checkpoint_id=where, process_group=side), b0)
        blocked.append(time.perf_counter() - b0)
    loop = time.perf_counter() - t0
    if pending is not None:
        pending[0].result()
        written.append(time.perf_counter() - pending[1])
    dist.barrier()
    if rank == 0:
        out.put((loop, blocked, written))
    dist.destroy_process_group()


def main():
    a = sys.argv[1:]
    if len(a) != 10:
        sys.exit(__doc__)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    loop, blocked, written = out.get()
    for p in procs:
        p.join()
        if p.exitcode:
            sys.exit(f"torch_async_ckpt.py: a process exited {p.exitcode}")
    print(f"torch_loop_s {loop:.3f}")
    print("torch_blocked_s " + " ".join(f"{x:.4f}" for x in blocked))
    print("torch_write_s " + " ".join(f"{x:.3f}" for x in written))


if __name__ == "__main__":
    main()
