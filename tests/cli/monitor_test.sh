#!/usr/bin/env bash
# Run monitoring, end to end on Fashion-MNIST: accelerator utilisation in
# every train record and log line; the loader starvation warning, once,
# when DTRAIN_FAULT slows the loader and never in a normal run; the
# end-of-run summary (time split, peak memory, training time over the
# segments of a run stopped by SIGTERM and resumed twice); TensorBoard
# event files read back with TensorBoard's own reader and compared with
# metrics.jsonl; no GPU fields and no NVML message on a CPU run.
#   monitor_test.sh DTRAIN SOURCE_DIR BUILD_DIR WORKDIR
# The reader's Python: $DTRAIN_TB_PYTHON, else python3 when it has the
# tensorboard package, else BUILD_DIR/tb-venv (launch/setup.sh makes it
# under DTRAIN_WITH_TENSORBOARD=1); without any the test skips (77).
set -uo pipefail
DTRAIN=$1
SRC=$2
BUILD=$3
W=$4
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=$SRC/data/fashion-mnist.h5
JOB=$SRC/configs/fashion-mnist-mlp.yaml

PY=${DTRAIN_TB_PYTHON:-}
if [ -z "$PY" ]; then
  if python3 -c "import tensorboard" 2>/dev/null; then
    PY=$(command -v python3)
  elif [ -x "$BUILD/tb-venv/bin/python" ]; then
    PY=$BUILD/tb-venv/bin/python
  fi
fi
if [ -z "$PY" ] || ! "$PY" -c "import tensorboard" 2>/dev/null; then
  echo "SKIP: no Python with the tensorboard package (run launch/setup.sh with DTRAIN_WITH_TENSORBOARD=1)"
  exit 77
fi
if [ ! -f "$DATA" ]; then
  echo "SKIP: $DATA is missing (launch/setup.sh imports it)"
  exit 77
fi
MPIRUN=(mpirun --oversubscribe -np 2)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

rm -rf "$W" && mkdir -p "$W"
cd "$W"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { # NAME CONDITION-STATUS
  if [ "$2" = 0 ]; then ok; else bad "$1"; fi
}
# pycheck NAME RUN_DIR PYTHON-EXPRESSIONS: the code sees `recs` (every
# record of metrics.jsonl), `train`, `evals` and `summary` (the last one).
pycheck() {
  local name=$1 run=$2 code=$3
  "$PY" - "$run/metrics.jsonl" <<PYEOF
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in recs if r["type"] == "train"]
evals = [r for r in recs if r["type"] == "eval"]
summary = [r for r in recs if r["type"] == "summary"][-1:] or [None]
summary = summary[0]
$code
PYEOF
  check "$name" $?
}
common=(--set "data.path=$DATA" --set train.schedule.warmup_steps=0)
# a small model for the runs that only need many quick steps (a sanitizer
# build runs the quick-start model's steps tens of times slower)
small=(--set "model.hidden=[32]")

# --- a normal run on 2 ranks: utilisation, summary, TensorBoard, no warning
"${MPIRUN[@]}" "$DTRAIN" train "$JOB" "${common[@]}" --set train.steps=60 \
  --set train.log_every=5 --set output.dir=normal >normal.out 2>&1
check "normal run exits 0 ($(tail -n 3 normal.out))" $?
grep -q "accel util [0-9]*%" normal/train.log
check "progress lines show the utilisation" $?
! grep -q "starving" normal/train.log
check "a normal run does not warn of loader starvation" $?
grep -q "done: .*accelerator utilisation [0-9]*%; time: data wait .*peak host memory" normal/train.log
check "the done line has utilisation, time split and peak memory" $?
! grep -qi "nvml" normal/train.log normal.out
check "no NVML message on a CPU run" $?
pycheck "train records carry accel_util in [0, 1], no GPU fields" normal '
assert len(train) == 12, len(train)
for r in train:
    assert 0 <= r["accel_util"] <= 1, r
    assert not any(k.startswith("gpu_") for k in r), r
'
pycheck "summary: shares sum to 1, peak memory, one segment" normal '
s = summary
shares = [s["share_" + k] for k in
          ("data_wait", "compute", "comm_exposed", "optimizer", "eval", "checkpoint", "other")]
assert abs(sum(shares) - 1) < 0.01, shares
assert all(0 <= x <= 1 for x in shares), shares
assert 0 < s["accel_util"] <= 1, s
assert s["peak_host_mem_bytes"] > 10 * 2**20, s
assert s["segments"] == 1 and abs(s["total_train_s"] - s["segment_s"]) < 1e-6, s
assert s["segment_s"] >= s["seconds"] > 0, s
assert not any(k.startswith("peak_gpu") for k in s), s
'
"$PY" "$HERE/tb_read.py" normal 1
check "TensorBoard holds what metrics.jsonl holds (normal run)" $?

# --- one rank: the replicated update (AdamW over the whole model, on the
# host) is optimizer time, not "other" (it is a tenth of the step here;
# the check asks for a hundredth)
"$DTRAIN" train "$JOB" "${common[@]}" --set train.steps=30 --set train.log_every=10 \
  --set output.dir=one >one.out 2>&1
check "one-rank run exits 0 ($(tail -n 3 one.out))" $?
pycheck "summary: one rank's update is counted as optimizer time" one '
s = summary
assert s["time_optimizer_s"] > 0.01 * s["time_compute_s"], s
'


# --- a slow loader: one warning with the numbers and the keys to raise.
# One worker reads each batch MS ms late, MS at least 3 times a step's
# compute as a first quick run measures it, so the device waits most of
# the time whatever the machine or build.
"$DTRAIN" train "$JOB" "${common[@]}" "${small[@]}" --set train.steps=10 \
  --set train.log_every=10 --set output.dir=probe >probe.out 2>&1
check "probe run exits 0 ($(tail -n 3 probe.out))" $?
ms=$("$PY" -c "
import json
r = [json.loads(l) for l in open('probe/metrics.jsonl') if '\"train\"' in l][-1]
print(max(40, int(3000 * (r['compute_s'] + r['optimizer_s'])) + 1))")
DTRAIN_FAULT=0:slowdata:$ms "$DTRAIN" train "$JOB" "${common[@]}" "${small[@]}" \
  --set train.steps=30 --set train.log_every=5 --set data.workers=1 --set data.prefetch=2 \
  --set output.dir=slow >slow.out 2>&1
check "slow-loader run exits 0 ($(tail -n 3 slow.out))" $?
n=$(grep -c "starving" slow/train.log)
check "the starvation warning appears exactly once (got $n)" $([ "$n" = 1 ]; echo $?)
grep -q "warn: the data loader is starving the device: accelerator utilisation [0-9]*% .*ms waiting for data against .*ms of compute. Raise data.workers (now 1) and data.prefetch (now 2)" slow/train.log
check "the warning has the numbers and the keys with their values" $?
pycheck "slow loader: utilisation under 90% after the first window" slow '
assert all(r["accel_util"] < 0.9 for r in train[1:]), [r["accel_util"] for r in train]
'

# --- stopped by SIGTERM twice and resumed: the time of every segment
# run_until_step STEP: starts the job in the background and sends SIGTERM
# once metrics.jsonl has a train record at STEP or later; returns its exit.
resumed=("${small[@]}" --set train.steps=900 --set train.log_every=20 --set output.dir=stopped)
run_until_step() {
  "$DTRAIN" train "$JOB" "${common[@]}" "${resumed[@]}" >>stopped.out 2>&1 &
  local pid=$! i
  for i in $(seq 6000); do
    grep -qs "\"type\":\"train\",\"epoch\":[0-9]*,\"step\":$1," stopped/metrics.jsonl && break
    sleep 0.05
  done
  kill -TERM "$pid"
  wait "$pid"
}
run_until_step 100
rc=$?
check "first segment stopped by SIGTERM exits 75 (got $rc)" $([ "$rc" = 75 ]; echo $?)
sleep 1.1 # the next event file gets another second in its name
run_until_step 400
rc=$?
check "second segment stopped by SIGTERM exits 75 (got $rc)" $([ "$rc" = 75 ]; echo $?)
sleep 1.1
"$DTRAIN" train "$JOB" "${common[@]}" "${resumed[@]}" >>stopped.out 2>&1
check "third segment finishes ($(tail -n 3 stopped.out))" $?
grep -q "done: 900 steps .* in all over 3 segments" stopped/train.log
check "the done line gives the time over 3 segments" $?
pycheck "summary: total time over 3 segments exceeds the last segment" stopped '
s = summary
assert s["segments"] == 3, s
assert s["total_train_s"] > s["segment_s"] + 0.2, s
starts = [r for r in recs if r["type"] == "start"]
assert len(starts) == 3 and starts[1]["first_step"] >= 100 and starts[2]["first_step"] >= 400, starts
steps = [r["step"] for r in train]
assert steps == sorted(set(steps)) and steps[-1] == 900, steps
'
"$PY" "$HERE/tb_read.py" stopped 3
check "TensorBoard holds what metrics.jsonl holds over 3 segments" $?

# --- output.tensorboard: false writes no event files
"$DTRAIN" train "$JOB" "${common[@]}" "${small[@]}" --set train.steps=20 --set train.log_every=10 \
  --set output.tensorboard=false --set output.dir=notb >notb.out 2>&1
check "run without TensorBoard exits 0" $?
check "output.tensorboard=false: no tensorboard directory" $([ ! -e notb/tensorboard ]; echo $?)

echo "monitor_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
