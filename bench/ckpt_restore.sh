#!/usr/bin/env bash
# How long a restart takes to its first step, resuming from an in-memory
# snapshot against resuming from the file checkpoint, for the GPT of
# bench/ckpt_async.sh (25.3 M parameters, AdamW: 304 MB of state) on 2
# ranks ("nodes" of one rank each, DTRAIN_RANKS_PER_NODE=1, so each rank
# also keeps the other's copy). A run with file checkpoints every 10 steps
# and snapshots every 5 is killed at step 17 (rank 1, kill -9); then,
# ROUNDS (default 3) times, alternating: the run itself is restarted
# (resumes from step 15's snapshot), and a copy of its directory, which is
# another run to the snapshots, with an empty checkpoint.memory_dir
# (resumes from step 10's file checkpoint). Each restart is killed again
# in its step 17. Per restart: the seconds from the launch to the
# first step's record in metrics.jsonl (MPI start-up, the model, the
# resume, one step), and the resume's own seconds from its log line.
# Needs: build/ (launch/setup.sh), python3, 2 cores.
#   [ROUNDS=3] [BUILD_DIR=build] bash bench/ckpt_restore.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
BUILD=${BUILD_DIR:-build}
work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt_restore.XXXXXX")
shm=$(mktemp -d /dev/shm/ckpt_restore.XXXXXX)
trap 'rm -rf "$work" "$shm"' EXIT
export DTRAIN_RANKS_PER_NODE=1

python3 tests/common/corpus.py 400000 >"$work/corpus.txt"
"$BUILD"/dtrain data import text "$work/corpus.txt" --val-fraction 0.005 -o "$work/text.h5" >/dev/null
cat >"$work/gpt.yaml" <<YEOF
model: {type: gpt, n_layer: 8, n_head: 8, n_embd: 512, dropout: 0}
data: {path: $work/text.h5, test_split: val, seq_len: 64, workers: 1}
train:
  steps: 40
  global_batch: 4
  eval_batch: 4
  log_every: 1
  optimizer: {name: adamw, lr: 0.0003, weight_decay: 0.1}
  schedule: {name: constant}
checkpoint: {every_minutes: 0, every_steps: 10, memory_every_steps: 5, keep_last: 2}
runtime: {threads: 1, progress: off}
YEOF
mpi() { bash tests/mpi/mpirun.sh 2 "$BUILD"/dtrain train "$work/gpt.yaml" "$@"; }

DTRAIN_FAULT=1:kill:17 mpi --set output.dir="$work/run" --set checkpoint.memory_dir="$shm" \
  >"$work/killed.out" 2>&1 && { echo "ckpt_restore.sh: the run was not killed" >&2; exit 1; }
grep -q "killing itself" "$work/killed.out" || { tail -5 "$work/killed.out" >&2; exit 1; }

restart() { # memory|file ROUND: prints "SECONDS_TO_FIRST_STEP RESUME_SECONDS"
  local how=$1 k=$2 dir="$work/run" mem="$shm" t0
  if [ "$how" = file ]; then # a copy of the run directory: another run, no snapshots
    dir="$work/file$k" mem="$work/empty$k"
    rm -rf "$dir" && cp -r "$work/run" "$dir" && mkdir -p "$mem"
  fi
  t0=$(date +%s.%N)
  # each restart is killed again in its step 17, so the killed run's
  # snapshot of step 15 stays for the next round
  DTRAIN_FAULT=1:kill:16 mpi --set output.dir="$dir" --set checkpoint.memory_dir="$mem" \
    >"$work/$how$k.out" 2>&1 || true
  python3 - "$dir/metrics.jsonl" "$t0" "$work/$how$k.out" "$how" <<'PY'
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
seg = [i for i, r in enumerate(recs) if r.get("type") == "start"][-1]
first = next(r for r in recs[seg:] if r.get("type") == "train")
log = open(sys.argv[3]).read()
pat = (r"resumed from the in-memory snapshot of step 15 in ([0-9.]+)s" if sys.argv[4] == "memory"
       else r"resumed from \S+ckpt-0000000010\.h5: .* in ([0-9.]+)s")
m = re.search(pat, log)
if not m:
    sys.exit(f"ckpt_restore.sh: no resume line like {pat!r}")
print(f"{first['time'] - float(sys.argv[2]):.2f} {m.group(1)}")
PY
}

echo "restart to the first step (s), resume alone (s)"
for ((k = 0; k < ROUNDS; k++)); do
  echo "round $((k + 1)): memory $(restart memory "$k"), file $(restart file "$k")"
done
