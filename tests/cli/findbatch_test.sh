#!/usr/bin/env bash
# dtrain find-batch and the out-of-memory fallback, end to end on the CPU:
#   findbatch_test.sh DTRAIN COMPARE_MODELS WORKDIR
# - find-batch under runtime.memory_limit: sizes double, then bisect; every
#   "fits" peak is within the limit less the margin, every miss is over it
#   or refused; the answer divides the per-rank batch, is the largest such
#   size below the first miss, and its --set line trains; the job's run
#   directory is not created and the temporary folders are removed;
# - bad arguments and a job where nothing fits;
# - DTRAIN_FAULT oom:32 with train.micro_batch=128: the run falls back to 32
#   (logged), trains, and ends with the parameters of a direct micro-batch
#   32 run (within 1e-5, what README claims for different splits of the
#   global batch); under mpirun -np 2 with the fault on rank 1 only, both
#   ranks halve together;
# - for a job on 2 ranks with comm.shard, each one-rank trial's peak less
#   the state the stage splits: a limit between the two peaks fits a row
#   sharded (gradients) and not replicated.
# - with comm.shard: parameters each trial's peak less the parameters'
#   split too (about 1.9 MiB more than gradients for the test's MLP).
set -u
DTRAIN=$1 COMPARE=$2 W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
PY=$(command -v python3)
fails=0
ok() { :; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

rm -rf "$W" && mkdir -p "$W/tmp" && cd "$W" || exit 1
export TMPDIR="$W/tmp"
mkdir idx && "$PY" "$HERE/make_idx.py" idx 4000 64 4 || exit 1
"$DTRAIN" data import idx idx -o tiny.h5 >/dev/null || exit 1
cat > job.yaml <<JOB
model:
  hidden: [4096]
data:
  path: tiny.h5
  workers: 1
train:
  epochs: 1
  global_batch: 3600
  eval_batch: 64
  optimizer:
    lr: 0.003
runtime:
  threads: 2
  progress: off
output:
  dir: run
JOB

# --- the search under a memory limit ------------------------------------------------
# The limit leaves about 100 MiB above the peak of a one-row micro-batch
# (measured first, so that the bound falls between 1024 and 2048 rows of
# about 50 KiB of activations each also where the process itself is larger,
# as under the sanitizers).
out=$("$DTRAIN" find-batch job.yaml --max 1 2>&1) || { echo "$out"; exit 1; }
p1=$(sed -n 's/^micro-batch *1: peak host memory [^(]*(\([0-9]*\) bytes).*/\1/p' <<<"$out")
[ -n "$p1" ] || { echo "no peak for micro-batch 1: $out"; exit 1; }
LIMIT=$(awk -v p="$p1" 'BEGIN { printf "%.4f", (p + 100 * 1048576) / 0.9 / 1073741824 }')
echo "peak at micro-batch 1: $p1 bytes; runtime.memory_limit=$LIMIT"
out=$("$DTRAIN" find-batch job.yaml --set runtime.memory_limit=$LIMIT 2>&1); rc=$?
echo "$out"
[ "$rc" = 0 ] || bad "find-batch exit $rc"
[ -e run ] && bad "find-batch created the job's run directory"
# (Open MPI keeps a session folder of its own, ompi.*, under TMPDIR)
ls tmp | grep -q dtrain-find-batch && bad "temporary folders left behind: $(ls tmp)"
best=$(sed -n 's/^  --set train.micro_batch=\([0-9]*\)$/\1/p' <<<"$out")
[ -n "$best" ] || bad "no --set line"
grep -q "global batch 3600 = micro-batch $best x accumulation $((3600 / ${best:-1})) x 1 rank" \
  <<<"$out" || bad "no accumulation line for $best"
# trial lines: size, peak bytes, fits 1/0, reason
grep -E '^micro-batch +[0-9]+: ' <<<"$out" |
  sed -E 's/^micro-batch +([0-9]+): peak host memory [^(]*\(([0-9]+) bytes\) of [^:]*: (fits|does not fit)(: (.*))?$/\1 \2 \3|\5/' \
    > trials.txt
awk -v limit=$LIMIT -v best="${best:-0}" -v per=3600 '
  { split($0, p, "|"); split(p[1], f, " "); m = f[1]; peak = f[2]; fit = (f[3] == "fits"); why = p[2]
    n++; size[n] = m; fits[n] = fit
    allowed = limit * 1073741824 * 0.9
    if (fit && peak > allowed) { print "fits but peak " peak " > " allowed; bad = 1 }
    if (!fit && peak <= allowed && why !~ /host memory on each rank/) {
      print "miss at " m " without a reason: " why; bad = 1 }
    if (fit && per % m == 0 && m > best) { print "a larger usable size fitted: " m; bad = 1 }
    if (!fit && (miss == 0 || m < miss)) miss = m
    if (fit && m > lastfit) lastfit = m }
  END {
    # doubling from 1 up to the first miss
    k = 1; want = 1
    while (k <= n && fits[k]) { if (size[k] != want) { print "doubling: size " size[k] " != " want; bad = 1 }
                                want *= 2; k++ }
    if (k > n) { print "no size missed"; bad = 1 }
    if (size[k] != want && size[k] != per) { print "doubling: miss at " size[k] " != " want; bad = 1 }
    lo = k > 1 ? size[k - 1] : 0; hi = size[k]
    for (k++; k <= n; k++) {   # bisection: each size inside the current bracket
      nb++
      if (!(size[k] > lo && size[k] < hi)) { print "bisection: " size[k] " outside (" lo ", " hi ")"; bad = 1 }
      if (fits[k]) lo = size[k]; else hi = size[k] }
    if (nb < 1) { print "no bisection step"; bad = 1 }
    if (per % best || best > lastfit || best >= miss) { print "answer " best " inconsistent"; bad = 1 }
    if (n < 12) { print "only " n " trials"; bad = 1 }
    exit bad }' trials.txt || bad "trial lines inconsistent (trials.txt above)"
# the suggestion, pasted, trains under the same limit without a fallback
out2=$("$DTRAIN" train job.yaml --set runtime.memory_limit=$LIMIT --set train.micro_batch="${best:-0}" \
       --set train.steps=2 --set output.dir=pasted 2>&1); rc=$?
[ "$rc" = 0 ] || bad "the suggested micro-batch did not train (exit $rc): $out2"
grep -q "micro-batch $best x" pasted/train.log || bad "pasted run used another micro-batch"
grep -q "does not fit" pasted/train.log && bad "pasted run fell back"

# --- bad arguments, nothing fits --------------------------------------------------------
expect() {
  local code=$1 pat=$2; shift 2
  local out rc
  out=$("$DTRAIN" find-batch "$@" 2>&1); rc=$?
  [ "$rc" = "$code" ] || { bad "find-batch $*: exit $rc, expected $code: $out"; return; }
  grep -qE -- "$pat" <<<"$out" || bad "find-batch $*: no /$pat/ in: $out"
}
expect 66 "no-such.yaml" no-such.yaml
expect 64 "--margin needs a number from 0 to below 1 \(0.1 keeps 10% free\), not '1.5'" job.yaml --margin 1.5
expect 64 "--margin needs a number from 0 to below 1 \(0.1 keeps 10% free\), not 'ten'" job.yaml --margin ten
expect 64 "-n needs a whole number" job.yaml -n 0
expect 64 "no job file" --max 8
expect 64 "does not split evenly over 7 ranks" job.yaml -n 7
expect 0 "usage: dtrain find-batch JOB.yaml" --help
expect 75 "not even a micro-batch of 1 row fits" job.yaml --set runtime.memory_limit=0.01
DTRAIN_FAULT=0:oom:0 expect 75 "DTRAIN_FAULT oom:0" job.yaml --max 4
expect 0 "global batch 3600 = micro-batch 4 x accumulation 450 x 2 ranks" job.yaml -n 2 --max 4
# under a launcher: rank 0 searches for the 2 ranks, the other rank exits at once
out=$(timeout -k 10 300 $MPIRUN 2 "$DTRAIN" find-batch job.yaml --max 2 2>&1); rc=$?
[ "$rc" = 0 ] || bad "find-batch under mpirun: exit $rc: $out"
[ "$(grep -c "^largest micro-batch" <<<"$out")" = 1 ] || bad "find-batch under mpirun: $out"
grep -q "micro-batch 2 x accumulation 900 x 2 ranks" <<<"$out" || bad "find-batch under mpirun: $out"
# interrupted: the temporary folder goes, exit 75
"$DTRAIN" find-batch job.yaml > int.out 2>&1 &
pid=$!
sleep 3
kill -TERM $pid
wait $pid; rc=$?
[ "$rc" = 75 ] || bad "interrupted find-batch: exit $rc: $(cat int.out)"
grep -q "find-batch: interrupted" int.out || bad "no interruption message: $(cat int.out)"
ls tmp | grep -q dtrain-find-batch && bad "interrupted find-batch left $(ls tmp)"
[ -e run ] && bad "find-batch created the job's run directory"

# --- the out-of-memory fallback ---------------------------------------------------------
cat > small.yaml <<JOB
model:
  hidden: [32]
  dropout: 0.1
data:
  path: tiny.h5
  workers: 1
train:
  steps: 12
  global_batch: 128
  eval_batch: 64
  optimizer:
    lr: 0.003
runtime:
  threads: 1
  progress: off
JOB
train() { "$DTRAIN" train small.yaml --set output.dir="$1" --set train.micro_batch="$2" >"$1.out" 2>&1; }
train direct 32 || bad "direct micro-batch 32 run failed: $(cat direct.out)"
DTRAIN_FAULT=0:oom:32 train fallback 128 || bad "fallback run failed: $(cat fallback.out)"
grep -q "warn: train.micro_batch=128 does not fit: out of memory allocating .* for the activations of a 128-row micro-batch (DTRAIN_FAULT oom:32); trying micro-batch 64 x accumulation 2 instead of 128 x 1" fallback/train.log ||
  bad "no fallback 128 -> 64 in the log: $(cat fallback/train.log)"
grep -q "micro_batch=64 does not fit.*trying micro-batch 32 x accumulation 4" fallback/train.log ||
  bad "no fallback 64 -> 32 in the log"
grep -q "global batch 128 = micro-batch 32 x 4 accumulation x 1 rank" fallback/train.log ||
  bad "fallback run does not train with micro-batch 32"
"$COMPARE" direct/model.h5 fallback/model.h5 1e-5 >/dev/null ||
  bad "fallback parameters differ from the direct micro-batch 32 run"
# two ranks, the fault on rank 1 only: both halve (64 -> 32 rows per rank)
out=$(DTRAIN_FAULT=1:oom:32 timeout -k 10 300 $MPIRUN 2 "$DTRAIN" train small.yaml \
      --set output.dir=mpi --set train.micro_batch=64 2>&1); rc=$?
[ "$rc" = 0 ] || bad "2-rank fallback exit $rc: $out"
grep -q "warn: train.micro_batch=64 does not fit: rank 1: out of memory.*trying micro-batch 32 x accumulation 2 instead of 64 x 1" mpi/train.log ||
  bad "2-rank fallback not logged: $(cat mpi/train.log)"
grep -q "global batch 128 = micro-batch 32 x 2 accumulation x 2 ranks" mpi/train.log ||
  bad "2-rank run does not train with micro-batch 32"
"$COMPARE" direct/model.h5 mpi/model.h5 1e-5 >/dev/null ||
  bad "2-rank fallback parameters differ from the direct run"
# the start-up memory check refusing only because of the micro-batch's activations
"$DTRAIN" train job.yaml --set runtime.memory_limit=$LIMIT --set train.steps=1 \
  --set output.dir=checked >checked.out 2>&1 || bad "memory-check fallback failed: $(cat checked.out)"
grep -q "warn: train.micro_batch=3600 does not fit: this job needs about .* more than runtime.memory_limit=[0-9.]* GiB.*trying micro-batch 1800 x accumulation 2 instead of 3600 x 1" \
  checked/train.log || bad "memory-check fallback not logged: $(cat checked/train.log)"
# down to one row, then the out-of-memory exit as before
DTRAIN_FAULT=0:oom:0 train none 4; rc=$?
[ "$rc" = 75 ] || bad "fallback to nothing: exit $rc, expected 75"
grep -q "^dtrain: out of memory allocating .* 1-row micro-batch" none.out ||
  bad "no final out-of-memory message: $(cat none.out)"
[ "$(grep -c 'does not fit' none/train.log)" = 2 ] || bad "expected 4 -> 2 -> 1 in the log"

# comm.shard: the trial's peak less the state each of the job's ranks
# would not hold (AdamW's state halved, and the gradients less the staging
# area, about 4.9 MiB for this 1.1 M-parameter MLP)
shard=(-n 2 --max 1 --set 'model.hidden=[1024,1024]' --set comm.bucket_mb=0.5)
peak1() { sed -n 's/^micro-batch *1: peak host memory [^(]*(\([0-9]*\) bytes).*/\1/p' <<<"$1"; }
outn=$("$DTRAIN" find-batch job.yaml "${shard[@]}" --set comm.shard=none 2>&1)
outg=$("$DTRAIN" find-batch job.yaml "${shard[@]}" --set comm.shard=gradients 2>&1)
pn=$(peak1 "$outn") pg=$(peak1 "$outg")
if [ -n "$pn" ] && [ -n "$pg" ] && grep -q "one rank's trial less .* that comm.shard splits" <<<"$outg" &&
   awk -v n="$pn" -v g="$pg" 'BEGIN { exit !(n - g > 3 * 1048576) }'; then
  lim=$(awk -v n="$pn" -v g="$pg" 'BEGIN { printf "%.6f", (n + g) / 2 / 0.9 / 1073741824 }')
  "$DTRAIN" find-batch job.yaml "${shard[@]}" --set comm.shard=none --set runtime.memory_limit="$lim" \
    >fbn.out 2>&1 && bad "replicated, a row fits under $lim GiB: $(cat fbn.out)"
  "$DTRAIN" find-batch job.yaml "${shard[@]}" --set comm.shard=gradients \
    --set runtime.memory_limit="$lim" >fbg.out 2>&1 && grep -q "train.micro_batch=1$" fbg.out ||
    bad "sharded, a row does not fit under $lim GiB: $(cat fbg.out)"
else
  bad "find-batch does not take off comm.shard's split: replicated $pn, sharded $pg bytes: $outg"
fi

# comm.shard: parameters splits the parameters too: with 0.1 MiB buckets
# (0.3 MiB of gather slots) about 1.9 MiB more than gradients, of this
# MLP's 4.4 MiB of parameters
split() { sed -n 's/^micro-batch *1: .*less \([0-9.]*\) MiB that comm.shard splits.*/\1/p' <<<"$1"; }
small=(-n 2 --max 1 --set 'model.hidden=[1024,1024]' --set comm.bucket_mb=0.1)
sg=$(split "$("$DTRAIN" find-batch job.yaml "${small[@]}" --set comm.shard=gradients 2>&1)")
sp=$(split "$("$DTRAIN" find-batch job.yaml "${small[@]}" --set comm.shard=parameters 2>&1)")
[ -n "$sg" ] && [ -n "$sp" ] && awk -v g="$sg" -v p="$sp" 'BEGIN { exit !(p - g > 1.5 && p - g < 2.5) }' ||
  bad "find-batch's split with comm.shard parameters: $sp MiB, with gradients $sg MiB"

[ "$fails" = 0 ] && echo "findbatch: all passed" || { echo "findbatch: $fails failed"; exit 1; }
