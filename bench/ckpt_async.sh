#!/usr/bin/env bash
# checkpoint.async: what periodic checkpoints cost the training loop, on
# a GPT whose checkpoint is large (8 layers x 512 wide, 25.3 M parameters,
# AdamW: 304 MB of parameters and moments per checkpoint), 2 ranks, a
# checkpoint every EVERY steps (default 50) of STEPS (default 160), in
# three modes run side by side:
#   none   no periodic checkpoints (checkpoint.async: off, so MPI runs
#          with MPI_THREAD_FUNNELED, as for a job without a writer thread)
#   sync   every checkpoint written before training goes on (async: off)
#   async  every checkpoint copied into host staging memory, then written
#          by the background writer while training goes on (async: on)
# Every mode ends with the same synchronous end-of-training checkpoint,
# which is outside the loop time compared here.
# Per run: the loop's wall time (metrics.jsonl's summary "seconds": the
# steps, the in-loop checkpoints and the evaluation), and for each
# periodic checkpoint from its metrics.jsonl record how long the loop was
# blocked (blocked_s: the copy, plus any wait for the write before it) and
# how long the write took (write_s). ROUNDS (default 3) rounds, the modes
# in rotating order; then the medians and the ratios the targets are
# stated in:
#   blocked:  async's median blocked_s over sync's (target at most 0.10)
#   run time: async's loop time over none's (target at most 1.05), and
#             sync's over none's
# The peer, where PyTorch 2 is installed (PEER_PY names its Python): the
# same GPT under DistributedDataParallel (gloo, 2 processes) with AdamW,
# saving with torch.distributed.checkpoint's save and async_save
# (bench/torch_async_ckpt.py), the same three modes in the same rounds.
#   python3 -m venv peer && peer/bin/pip install torch==2.5.1 h5py
# Needs: build/ (launch/setup.sh), python3, 2 cores.
#   [ROUNDS=3] [BUILD_DIR=build] [PEER_PY=python] bash bench/ckpt_async.sh [STEPS] [EVERY]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-160}
EVERY=${2:-50}
ROUNDS=${ROUNDS:-3}
BUILD=${BUILD_DIR:-build}
work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt_async.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 tests/common/corpus.py 400000 >"$work/corpus.txt"
"$BUILD"/dtrain data import text "$work/corpus.txt" --val-fraction 0.005 -o "$work/text.h5" >/dev/null
cat >"$work/gpt.yaml" <<YEOF
model: {type: gpt, n_layer: 8, n_head: 8, n_embd: 512, dropout: 0}
data: {path: $work/text.h5, test_split: val, seq_len: 64, workers: 1}
train:
  steps: $STEPS
  global_batch: 4
  eval_batch: 4
  log_every: 10
  optimizer: {name: adamw, lr: 0.0003, weight_decay: 0.1}
  schedule: {name: constant}
checkpoint: {every_minutes: 0, every_steps: $EVERY, keep_last: 2}
runtime: {threads: 1, progress: off}
YEOF

run() { # MODE ROUND
  local mode=$1 name="$1$2" every=$EVERY async=on
  [ "$mode" = none ] && every=0
  [ "$mode" != async ] && async=off
  bash tests/mpi/mpirun.sh 2 "$BUILD"/dtrain train "$work/gpt.yaml" --set output.dir="$work/$name" \
    --set checkpoint.every_steps="$every" --set checkpoint.async="$async" >"$work/$name.out" 2>&1 ||
    { echo "ckpt_async.sh: run $name failed:" >&2; tail -5 "$work/$name.out" >&2; exit 1; }
  rm -rf "$work/$name/checkpoints" "$work/$name/model.h5"
}

PEER_PY=${PEER_PY:-python3}
peer=0
"$PEER_PY" -c 'import torch.distributed.checkpoint as d, h5py; d.async_save' 2>/dev/null && peer=1
peer_run() { # MODE ROUND
  (cd bench && "$PEER_PY" torch_async_ckpt.py "$work/text.h5" "$work/torch$1$2" "$STEPS" "$EVERY" 4 64 \
    8 8 512 "$1") >"$work/torch$1$2.out" 2>&1 ||
    { echo "ckpt_async.sh: the PyTorch peer failed ($1):" >&2; tail -5 "$work/torch$1$2.out" >&2; exit 1; }
  rm -rf "$work/torch$1$2"
}

modes=(none sync async)
for ((k = 0; k < ROUNDS; k++)); do
  for ((j = 0; j < 3; j++)); do
    mode=${modes[$(((j + k) % 3))]}
    echo "round $((k + 1)): $mode" >&2
    run "$mode" "$k"
    if [ "$peer" = 1 ]; then peer_run "$mode" "$k"; fi
  done
done
[ "$peer" = 1 ] || echo "(no PyTorch with torch.distributed.checkpoint.async_save for $PEER_PY: no peer)"

python3 - "$work" "$ROUNDS" "$STEPS" "$peer" <<'PY'
import json, statistics, sys
work, rounds, steps, peer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"

def recs(name, kind):
    out = []
    for line in open(f"{work}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if r.get("type") == kind:
            out.append(r)
    return out

loop = {m: [] for m in ("none", "sync", "async")}
blocked = {m: [] for m in ("sync", "async")}
write = {m: [] for m in ("sync", "async")}
for k in range(rounds):
    for m in loop:
        loop[m].append(recs(f"{m}{k}", "summary")[-1]["seconds"])
        if m == "none":
            continue
        periodic = [r for r in recs(f"{m}{k}", "checkpoint") if r["step"] < steps]
        blocked[m] += [r["blocked_s"] for r in periodic]
        write[m] += [r["write_s"] for r in periodic]

med = statistics.median
print(f"{'mode':6} {'loop s (each round)':32} {'median':>8} {'blocked s per ckpt (median, range)':>36} {'write s (median)':>17}")
for m in loop:
    each = " ".join(f"{x:.1f}" for x in loop[m])
    b = (f"{med(blocked[m]):.3f} ({min(blocked[m]):.3f}-{max(blocked[m]):.3f})"
         if m in blocked else "-")
    w = f"{med(write[m]):.2f}" if m in write else "-"
    print(f"{m:6} {each:32} {med(loop[m]):8.1f} {b:>36} {w:>17}")
ratio = [a / n for a, n in zip(loop["async"], loop["none"])]
sratio = [s / n for s, n in zip(loop["sync"], loop["none"])]
print(f"blocked per checkpoint, async / sync: {med(blocked['async']) / med(blocked['sync']):.3f} "
      f"(target at most 0.10)")
print(f"loop time async / none: median {med(ratio):.3f}, rounds "
      + " ".join(f"{x:.3f}" for x in ratio) + " (target at most 1.05)")
print(f"loop time sync / none:  median {med(sratio):.3f}, rounds "
      + " ".join(f"{x:.3f}" for x in sratio))
if peer:
    def peer_out(name):
        got = {}
        for line in open(f"{work}/{name}.out"):
            k, _, v = line.partition(" ")
            if k.startswith("torch_"):
                got[k] = [float(x) for x in v.split()]
        return got
    tl = {m: [] for m in loop}
    tb = {m: [] for m in ("sync", "async")}
    tw = {m: [] for m in ("sync", "async")}
    for k in range(rounds):
        for m in tl:
            o = peer_out(f"torch{m}{k}")
            tl[m].append(o["torch_loop_s"][0])
            if m != "none":
                tb[m] += o.get("torch_blocked_s", [])
                tw[m] += o.get("torch_write_s", [])
    print("PyTorch peer (DDP, torch.distributed.checkpoint):")
    for m in tl:
        b = f"{med(tb[m]):.3f} ({min(tb[m]):.3f}-{max(tb[m]):.3f})" if m in tb else "-"
        w = f"{med(tw[m]):.2f}" if m in tw else "-"
        print(f"{m:6} {' '.join(f'{x:.1f}' for x in tl[m]):32} {med(tl[m]):8.1f} {b:>36} {w:>17}")
    print(f"peer blocked per save, async / sync: {med(tb['async']) / med(tb['sync']):.3f}; loop time "
          f"async / none: {med([a / n for a, n in zip(tl['async'], tl['none'])]):.3f}, sync / none: "
          f"{med([s / n for s, n in zip(tl['sync'], tl['none'])]):.3f}")
PY
