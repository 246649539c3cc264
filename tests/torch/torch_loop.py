#!/usr/bin/env python3
"""dtrain's real training loop, step by step, against PyTorch.

Runs the `dtrain train` executable on small generated data with SGD
(momentum, weight decay), clipping by global norm, a warm-up schedule,
dropout, a metrics record and a checkpoint after every step, in three
cases: 1 rank, 1 rank with gradient accumulation, and 2 ranks with
accumulation under real mpirun (there with a short last batch, drop_last
off). Then, for every step k, it rebuilds in PyTorch what that step must
do, starting from what dtrain holds before it (checkpoint k-1, or for the
first step the initialisation, redrawn here from its definition):
  - the global batch: dtrain's shuffle (Philox4x32-10 keyed by train.seed
    and the epoch, a Fisher-Yates shuffle), the dataset's normalisation;
  - the dropout masks, drawn here as dtrain draws them: Philox keyed by
    (seed, purpose, layer, step), one word per element, rows numbered
    within the global batch, so the masks do not depend on the split;
  - the mean cross-entropy over the global batch, its gradients
    (autograd), clipping (torch.nn.utils.clip_grad_norm_), the learning
    rate of that step and torch.optim.SGD with dtrain's momentum buffers.
It checks, every step: the parameters and momentum buffers of checkpoint
k within 1e-5 relative to each tensor's largest value; metrics.jsonl's
grad_norm (before clipping), loss and lr within 1e-5 relative; the
checkpoint's position in the data. Each case must clip on some steps and
not on others, so that both paths are measured.

  torch_loop.py --dtrain DTRAIN --workdir DIR
Exit 0 when all match, 1 on a mismatch or a failed run, 77 (skipped)
without PyTorch.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # reported as skipped by ctest, never as passed
    print(f"SKIP: PyTorch/numpy not importable ({e}); install python3-torch")
    sys.exit(77)
try:
    import h5py
except ImportError as e:  # a missing reader is a broken setup, not a skip
    print(f"FAIL: h5py not importable ({e}); install python3-h5py")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_IDX = os.path.join(HERE, "..", "cli", "make_idx.py")
MPIRUN = os.path.join(HERE, "..", "mpi", "mpirun.sh")

N_TRAIN, N_TEST, CLASSES = 150, 40, 4
HIDDEN, DROPOUT, SEED, STEPS, GLOBAL_BATCH = [32, 16], 0.25, 42, 8, 32
PARAM_TOL = STATE_TOL = NORM_TOL = LOSS_TOL = LR_TOL = 1e-5
RUN_TIMEOUT_S = 120

# name, ranks, job keys (beside the common ones below)
CASES = [
    ("1rank", 1, {"train.micro_batch": 0, "train.clip_norm": 1.0,
                  "train.schedule.name": "cosine", "train.schedule.warmup_steps": 2,
                  "train.schedule.min_lr": 0.002}),
    ("1rank-accum", 1, {"train.micro_batch": 8, "train.clip_norm": 1.0,
                        "train.optimizer.nesterov": "true",
                        "train.schedule.name": "step", "train.schedule.warmup_steps": 3,
                        "train.schedule.step_size": 2, "train.schedule.gamma": 0.5}),
    ("2ranks-accum", 2, {"train.micro_batch": 4, "train.clip_norm": 1.0,
                         "data.drop_last": "false",
                         "train.schedule.name": "cosine", "train.schedule.warmup_steps": 2,
                         "train.schedule.min_lr": 0.01}),
]
COMMON = {"train.steps": STEPS, "train.global_batch": GLOBAL_BATCH, "train.seed": SEED,
          "train.eval_batch": N_TEST, "train.log_every": 1, "train.optimizer.name": "sgd",
          "train.optimizer.lr": 0.1, "train.optimizer.momentum": 0.9,
          "train.optimizer.nesterov": "false", "train.optimizer.weight_decay": 0.01,
          "data.shuffle": "true", "data.drop_last": "true", "data.workers": 1,
          "checkpoint.every_steps": 1, "checkpoint.keep_last": 1000, "runtime.threads": 1,
          "runtime.progress": "off"}

# ---- Philox4x32-10 as core/rng.c defines it ---------------------------

M32, M64 = 0xFFFFFFFF, (1 << 64) - 1
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PURPOSE_INIT, PURPOSE_SHUFFLE, PURPOSE_DROPOUT = 1, 2, 3


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def philox(seed, purpose, stream, step, index, sub=0):
    """The four words of block `index` (an array of counters) for the key."""
    k = mix64(seed ^ mix64((purpose << 32) | stream))
    hi = mix64((step + 0x9E3779B97F4A7C15) & M64) ^ sub
    index = np.asarray(index, dtype=np.uint64)
    c0, c1 = index & np.uint64(M32), index >> np.uint64(32)
    c2 = np.full_like(index, hi & M32)
    c3 = np.full_like(index, hi >> 32)
    k0, k1 = k & M32, k >> 32
    lo32, s32 = np.uint64(M32), np.uint64(32)
    for _ in range(10):
        p0, p1 = np.uint64(PHILOX_M0) * c0, np.uint64(PHILOX_M1) * c2
        c0, c2 = (p1 >> s32) ^ c1 ^ np.uint64(k0), (p0 >> s32) ^ c3 ^ np.uint64(k1)
        c1, c3 = p1 & lo32, p0 & lo32
        k0, k1 = (k0 + PHILOX_W0) & M32, (k1 + PHILOX_W1) & M32
    return c0, c1, c2, c3


def unit(word):
    """A word as a float in [0, 1): its top 24 bits / 2^24 (exact in float32)."""
    return (word >> np.uint64(8)).astype(np.float64) / 16777216.0


def below(seed, epoch, index, n):
    """Shuffle draw `index` of an epoch: uniform in [0, n) by rejection on
    64 bits, retries on the sub-counter."""
    limit = M64 - M64 % n
    sub = 0
    while True:
        w = philox(seed, PURPOSE_SHUFFLE, 0, epoch, [index], sub)
        x = (int(w[1][0]) << 32) | int(w[0][0])
        if x < limit:
            return x % n
        sub += 1


def permutation(seed, epoch, n):
    """Fisher-Yates: swap i uses draw i - 1, from the end down."""
    perm = list(range(n))
    for i in range(n, 1, -1):
        j = below(seed, epoch, i - 1, i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return np.array(perm)


def dropout_scale(layer_id, step, rows, cols, p):
    """(rows, cols) float32: 1/(1-p) where kept, 0 where dropped. Element
    e = row * cols + col of the global batch uses word e % 4 of block e / 4."""
    e = np.arange(rows * cols, dtype=np.uint64)
    words = np.stack(philox(SEED, PURPOSE_DROPOUT, layer_id, step, e // np.uint64(4)))
    word = words[(e % np.uint64(4)).astype(np.int64), np.arange(e.size)]
    pf = float(np.float32(p))
    keep = unit(word) >= pf
    scale = np.float32(1.0) / (np.float32(1.0) - np.float32(p))
    return torch.from_numpy(np.where(keep, scale, np.float32(0)).astype(np.float32)
                            .reshape(rows, cols))


# ---- the model, the data and the schedule -----------------------------------

def layer_names():
    return [f"fc{i + 1}" for i in range(len(HIDDEN) + 1)]


def dropout_layer_ids():
    """Layer positions of the dropouts: flatten, then (linear, activation,
    dropout) per hidden layer; the position keys the dropout's draws."""
    return [1 + 3 * i + 2 for i in range(len(HIDDEN))]


def initial_params(in_dim):
    """Kaiming uniform for relu (bound sqrt(2) * sqrt(3 / fan_in)), the
    tensor's index in creation order (weight, bias per layer) as stream;
    biases zero."""
    params, dims, idx = {}, [in_dim] + HIDDEN + [CLASSES], 0
    for i, name in enumerate(layer_names()):
        fan_in, fan_out = dims[i], dims[i + 1]
        bound = math.sqrt(2.0) * math.sqrt(3.0 / fan_in)
        u = unit(philox(SEED, PURPOSE_INIT, idx, 0, np.arange(fan_in * fan_out))[0])
        params[f"{name}.weight"] = ((2.0 * u - 1.0) * bound).astype(np.float32).reshape(
            fan_out, fan_in)
        params[f"{name}.bias"] = np.zeros(fan_out, dtype=np.float32)
        idx += 2
    return params


def schedule_lr(job, step):
    """Learning rate of 0-based step `step`: linear warm-up to the peak over
    warmup_steps, then step decay, or cosine down to min_lr at the last step."""
    lr, warm = job["train.optimizer.lr"], job["train.schedule.warmup_steps"]
    if step < warm:
        return lr * (step + 1) / warm
    s = step - warm
    if job["train.schedule.name"] == "step":
        return lr * job["train.schedule.gamma"] ** (s // job["train.schedule.step_size"])
    lo = job.get("train.schedule.min_lr", 0.0)
    span = STEPS - warm - 1
    frac = min(s / span, 1.0) if span > 0 else 1.0
    return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * frac))


def load_dataset(path):
    with h5py.File(path, "r") as f:
        x = f["train/x"][()]
        y = f["train/y"][()].astype(np.int64)
        scale, mean, std = (np.float32(f.attrs[k]) for k in ("norm_scale", "norm_mean", "norm_std"))
    x = (x.reshape(len(x), -1).astype(np.float32) * scale - mean) / std
    return x.astype(np.float32), y


def batches(job, n):
    """(epoch, first position, rows) of every step, in order."""
    g, drop_last = job["train.global_batch"], job["data.drop_last"] == "true"
    per_epoch = n // g if drop_last else -(-n // g)
    out = []
    for step in range(STEPS):
        epoch, b = divmod(step, per_epoch)
        out.append((epoch, b * g, min(g, n - b * g)))
    return out, per_epoch


# ---- one step in PyTorch ---------------------------------------------------------

def forward_loss(params, x, y, step):
    h = x
    names, drop_ids = layer_names(), dropout_layer_ids()
    for i, name in enumerate(names):
        h = torch.nn.functional.linear(h, params[f"{name}.weight"], params[f"{name}.bias"])
        if i < len(HIDDEN):
            h = torch.relu(h) * dropout_scale(drop_ids[i], step, h.shape[0], h.shape[1], DROPOUT)
    return torch.nn.functional.cross_entropy(h, y)


def torch_step(job, before, momentum, x, y, step):
    """One optimizer step from parameters `before` (and momentum buffers,
    None before the first step). Returns (params, buffers, pre-clip norm,
    loss, lr)."""
    params = {k: torch.tensor(v, requires_grad=True) for k, v in before.items()}
    names = list(params)
    # dtrain's parameter groups: weight decay on the weights, biases take
    # train.optimizer.bias_weight_decay (0 unless the job sets it)
    groups = [{"params": [params[k] for k in names if k.endswith(".weight")],
               "weight_decay": job["train.optimizer.weight_decay"]},
              {"params": [params[k] for k in names if not k.endswith(".weight")],
               "weight_decay": job.get("train.optimizer.bias_weight_decay", 0.0)}]
    opt = torch.optim.SGD(groups, lr=1.0,
                          momentum=job["train.optimizer.momentum"],
                          nesterov=job["train.optimizer.nesterov"] == "true")
    if momentum is not None:
        for k in names:
            opt.state[params[k]]["momentum_buffer"] = torch.tensor(momentum[k])
    loss = forward_loss(params, x, y, step)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([params[k] for k in names], job["train.clip_norm"])
    lr = schedule_lr(job, step)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    after = {k: params[k].detach().numpy().copy() for k in names}
    bufs = {k: opt.state[params[k]]["momentum_buffer"].numpy().copy() for k in names}
    return after, bufs, float(norm), float(loss), lr


# ---- running dtrain ----------------------------------------------------------------

def write_job(path, job, run_dir, data):
    keys = dict(job, **{"data.path": data, "output.dir": run_dir})
    lines = ["model:", "  type: mlp", f"  hidden: [{', '.join(map(str, HIDDEN))}]",
             "  activation: relu", f"  dropout: {DROPOUT}", "  init: kaiming"]
    tree = {}
    for key, v in keys.items():
        parts = key.split(".")
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v

    def emit(node, depth):
        for k, v in node.items():
            if isinstance(v, dict):
                lines.append("  " * depth + f"{k}:")
                emit(v, depth + 1)
            else:
                lines.append("  " * depth + f"{k}: {v}")
    emit(tree, 0)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run_dtrain(dtrain, work, name, ranks, job, data):
    run_dir = os.path.join(work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    job_path = os.path.join(work, f"{name}.yaml")
    write_job(job_path, job, run_dir, data)
    cmd = [dtrain, "train", job_path, "--resume", "never"]
    if ranks > 1:
        cmd = ["bash", MPIRUN, str(ranks)] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=RUN_TIMEOUT_S)
    if p.returncode != 0:
        print(p.stdout)
        raise RuntimeError(f"{name}: dtrain exited {p.returncode}")
    return run_dir


def read_checkpoint(run_dir, step):
    path = os.path.join(run_dir, "checkpoints", f"ckpt-{step:010d}.h5")
    with h5py.File(path, "r") as f:
        params = {k: f[f"params/{k}"][()] for k in f["params"]}
        momentum = {k: f[f"optim/momentum/{k}"][()] for k in f["optim/momentum"]}
        meta = {k: int(f.attrs[k]) for k in ("step", "epoch", "batch", "samples", "optim_t")}
    return params, momentum, meta


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return {r["step"]: r for r in recs if r["type"] == "train"}


def rel_err(a, b):
    scale = max(float(np.abs(b).max()), 1e-12)
    return float(np.abs(a - b).max()) / scale


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


# ---- one case ----------------------------------------------------------------------

def check_case(name, ranks, keys, dtrain, work, data, x_all, y_all):
    job = dict(COMMON, **keys)
    run_dir = run_dtrain(dtrain, work, name, ranks, job, data)
    metrics = read_metrics(run_dir)
    plan, per_epoch = batches(job, len(x_all))
    failures, worst, clipped = [], {"param": 0.0, "state": 0.0, "norm": 0.0}, []
    before, momentum = initial_params(x_all.shape[1]), None
    perms = {}
    for step, (epoch, pos, rows) in enumerate(plan):
        if epoch not in perms:
            perms[epoch] = permutation(SEED, epoch, len(x_all))
        ids = perms[epoch][pos:pos + rows]
        x, y = torch.from_numpy(x_all[ids]), torch.from_numpy(y_all[ids])
        want, want_buf, norm, loss, lr = torch_step(job, before, momentum, x, y, step)
        got, got_buf, meta = read_checkpoint(run_dir, step + 1)
        tag = f"{name} step {step + 1}"
        done = step + 1
        # after an epoch's last batch: (that epoch, batches per epoch)
        position = {"step": done, "epoch": step // per_epoch,
                    "batch": done - step // per_epoch * per_epoch,
                    "samples": sum(r for _, _, r in plan[:done]), "optim_t": done}
        if meta != position:
            failures.append(f"{tag}: checkpoint position {meta}, expected {position}")
        e_p = max(rel_err(got[k], want[k]) for k in want)
        e_s = max(rel_err(got_buf[k], want_buf[k]) for k in want)
        rec = metrics.get(done)
        if rec is None:
            failures.append(f"{tag}: no train record in metrics.jsonl")
            break
        e_n = rel(rec["grad_norm"], norm)
        for what, e, tol in (("parameters", e_p, PARAM_TOL), ("momentum buffers", e_s, STATE_TOL),
                             ("grad_norm", e_n, NORM_TOL),
                             ("loss", rel(rec["loss"], loss), LOSS_TOL),
                             ("lr", rel(rec["lr"], lr), LR_TOL)):
            if e > tol:
                failures.append(f"{tag}: {what} differ by {e:.3g} (tolerance {tol:g})")
        worst = {"param": max(worst["param"], e_p), "state": max(worst["state"], e_s),
                 "norm": max(worst["norm"], e_n)}
        clip = norm > job["train.clip_norm"]
        clipped.append(clip)
        print(f"{tag}: {rows} rows, lr {lr:.6g}, grad_norm {rec['grad_norm']:.6g} (torch "
              f"{norm:.6g}{', clipped' if clip else ''}), loss {rec['loss']:.6f} (torch "
              f"{loss:.6f}); rel err parameters {e_p:.2e}, momentum {e_s:.2e}")
        before, momentum = got, got_buf  # the next step starts from dtrain's state
    if not (any(clipped) and not all(clipped)):
        failures.append(f"{name}: clipping was active on {sum(clipped)} of {len(clipped)} steps; "
                        "the case must clip on some steps and not on others")
    print(f"{name}: worst rel err parameters {worst['param']:.2e}, momentum {worst['state']:.2e}, "
          f"grad_norm {worst['norm']:.2e}; clipped on {sum(clipped)} of {len(clipped)} steps")
    return failures


def make_data(dtrain, work):
    idx = os.path.join(work, "idx")
    os.makedirs(idx, exist_ok=True)
    subprocess.run([sys.executable, MAKE_IDX, idx, str(N_TRAIN), str(N_TEST), str(CLASSES)],
                   check=True)
    data = os.path.join(work, "data.h5")
    subprocess.run([dtrain, "data", "import", "idx", idx, "-o", data, "--force"], check=True,
                   stdout=subprocess.DEVNULL)
    return data


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    torch.set_num_threads(1)
    data = make_data(args.dtrain, args.workdir)
    x_all, y_all = load_dataset(data)
    failures = []
    for name, ranks, keys in CASES:
        try:
            failures += check_case(name, ranks, keys, args.dtrain, args.workdir, data, x_all,
                                   y_all)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            failures.append(f"{name}: {e}")
    for f in failures:
        print("MISMATCH:", f)
    print(f"torch_loop: {len(CASES)} cases x {STEPS} steps, {len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
