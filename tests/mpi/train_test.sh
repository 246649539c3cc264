#!/usr/bin/env bash
# Multi-rank training under real mpirun on generated data:
#   - 1 rank x accumulation 4, 2 ranks x 2 and 4 ranks x 1 see the same
#     samples per step: same losses (1e-5) and final parameters (1e-5);
#   - two runs with the same world size are bit-identical, and so are
#     overlap off (the sums do not depend on timing); tiny buckets cut the
#     ring's chunks elsewhere, so on 4 ranks they sum in another order
#     (within 1e-5), and with the library's all-reduce they are
#     bit-identical again;
#   - bf16 gradients on the wire stay close to fp32 ones, and do not
#     depend on the bucket size either;
#   - each rank reads about 1/N of the training bytes;
#   - a short last batch (drop_last off) neither hangs nor repeats samples,
#     and one of a single row (three ranks get none) gives 1 rank's result;
#   - bad input and a failing rank stop every rank with one message naming
#     the rank, with the right exit code, and never hang.
#   train_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1 COMPARE=$2 W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/mpirun.sh"
PY=$(command -v python3)
rm -rf "$W" && mkdir -p "$W/idx" "$W/idx2" "$W/idx3"
cd "$W"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# run NAME NP [args...]: one training run into run NAME, output in NAME.out
run() {
  local name=$1 np=$2; shift 2
  timeout -k 10 300 $MPIRUN "$np" "$DTRAIN" train job.yaml --set output.dir="$name" "$@" > "$name.out" 2>&1
}
losses() { grep '"type":"train"' "$1/metrics.jsonl" | sed 's/.*"loss":\([-0-9.e]*\).*/\1/'; }
# same_losses A B TOL: every step's loss within TOL relative
same_losses() {
  paste <(losses "$1") <(losses "$2") | awk -v t="$3" '
    { n++; d = $1 - $2; if (d < 0) d = -d; if (d > t * $1) bad++ }
    END { exit !(n > 0 && bad == 0) }'
}
# [FAULT=...] expect_fail CODE PATTERN NP [args...]: a run that must fail
# with CODE and PATTERN, printing exactly one error line
expect_fail() {
  local code=$1 pat=$2 np=$3; shift 3
  local out rc
  out=$(DTRAIN_FAULT="${FAULT:-}" timeout -k 10 120 $MPIRUN "$np" "$DTRAIN" train job.yaml \
        --set output.dir=fail "$@" 2>&1); rc=$?
  if [ "$rc" = 124 ]; then bad "hung: $*"; return; fi
  if [ "$rc" != "$code" ]; then bad "exit $rc, expected $code: $*: $out"; return; fi
  grep -qE -- "$pat" <<<"$out" || { bad "no /$pat/ in: $out"; return; }
  local lines
  lines=$(grep -c "^dtrain: " <<<"$out")
  [ "$lines" = 1 ] || { bad "$lines error lines (expected 1): $out"; return; }
  ok
}

"$PY" "$HERE/../cli/make_idx.py" idx 1024 200 4 || exit 1
"$PY" "$HERE/../cli/make_idx.py" idx2 1000 200 4 || exit 1
"$PY" "$HERE/../cli/make_idx.py" idx3 1001 200 4 || exit 1
"$DTRAIN" data import idx idx -o tiny.h5 >/dev/null || exit 1
"$DTRAIN" data import idx idx2 -o other.h5 >/dev/null || exit 1
"$DTRAIN" data import idx idx3 -o odd.h5 >/dev/null || exit 1
cat > job.yaml <<JOB
model:
  hidden: [32]
  dropout: 0.1
data:
  path: tiny.h5
  workers: 1
train:
  epochs: 2
  global_batch: 32
  eval_batch: 64
  log_every: 1
  optimizer:
    lr: 0.003
runtime:
  threads: 1
  progress: lines
JOB

# --- the same answer on any world size ------------------------------------------
run a1 1 --set train.micro_batch=8 || bad "1 rank: $(cat a1.out)"
run b4 4 --set train.micro_batch=8 || bad "4 ranks: $(cat b4.out)"
run c2 2 --set train.micro_batch=4 || bad "2 ranks: $(cat c2.out)"
grep -q "4 ranks" b4/train.log && ok || bad "4-rank log does not say 4 ranks"
[ "$(grep -c 'rank [0-3]/4 on' b4.out)" = 4 ] && ok || bad "not one start-up line per rank"
same_losses a1 b4 1e-5 && ok || bad "losses 1 rank x4 vs 4 ranks differ"
same_losses a1 c2 1e-5 && ok || bad "losses 1 rank x4 vs 2 ranks x2 differ"
"$COMPARE" a1/model.h5 b4/model.h5 1e-5 >/dev/null && ok || bad "final parameters 1 vs 4 ranks: $("$COMPARE" a1/model.h5 b4/model.h5 1e-5)"
"$COMPARE" a1/model.h5 c2/model.h5 1e-5 >/dev/null && ok || bad "final parameters 1 vs 2 ranks"

# --- bit-identical repeats -------------------------------------------------------
run d4 4 --set train.micro_batch=8 || bad "4 ranks again"
"$COMPARE" b4/model.h5 d4/model.h5 0 >/dev/null && ok || bad "two 4-rank runs are not bit-identical"
run e4 4 --set train.micro_batch=8 --set comm.overlap=false || bad "overlap off"
"$COMPARE" b4/model.h5 e4/model.h5 0 >/dev/null && ok || bad "overlap off changed the result"
run f4 4 --set train.micro_batch=8 --set comm.bucket_mb=0.001 || bad "tiny buckets"
"$COMPARE" b4/model.h5 f4/model.h5 1e-5 >/dev/null && ok || bad "tiny buckets changed the result"
run lib4 4 --set train.micro_batch=8 --set comm.mpi_allreduce=library || bad "library all-reduce"
run libt4 4 --set train.micro_batch=8 --set comm.mpi_allreduce=library --set comm.bucket_mb=0.001 \
  || bad "library all-reduce, tiny buckets"
"$COMPARE" lib4/model.h5 libt4/model.h5 0 >/dev/null && ok || bad "library: tiny buckets changed the result"
"$COMPARE" b4/model.h5 lib4/model.h5 1e-5 >/dev/null && ok || bad "ring and library differ by more than 1e-5"
nb=$(sed -n 's/.* in \([0-9]*\) buckets of up to.*/\1/p' f4/train.log)
[ -n "$nb" ] && [ "$nb" -ge 5 ] && ok || bad "tiny buckets gave '${nb}' buckets, expected several"

# --- the sharded update ------------------------------------------------------------
# Each rank updates its chunks and gathers the rest: on 2 ranks (where the
# order of a sum of two does not matter) the parameters are the full
# update's bit for bit; on 4 this small model's buckets are under the
# ring's 64 KiB, so the full update sums them with the MPI library's
# all-reduce, in another order. A checkpoint holds the whole optimizer
# state: resumed on 1 rank, the sharded and the full run go on alike.
grep -q "reduce-scattered over mpi (ring).*each rank keeps the optimizer state of its 1/world" b4/train.log \
  && ok || bad "the sharded update is not logged: $(grep gradients b4/train.log)"
run full4 4 --set train.micro_batch=8 --set comm.shard=none || bad "full update"
grep -q "all-reduced over mpi" full4/train.log && ok || bad "full update not logged"
"$COMPARE" b4/model.h5 full4/model.h5 1e-6 >/dev/null && ok \
  || bad "sharded and full update, 4 ranks: $("$COMPARE" b4/model.h5 full4/model.h5 1e-6)"
run sh2 2 --set train.clip_norm=0.05 || bad "sharded, 2 ranks, clipping"
run fu2 2 --set train.clip_norm=0.05 --set comm.shard=none || bad "full, 2 ranks, clipping"
"$COMPARE" sh2/model.h5 fu2/model.h5 0 >/dev/null && ok \
  || bad "sharded and full update with clipping: $("$COMPARE" sh2/model.h5 fu2/model.h5 0)"
for r in sh2 fu2; do
  cp -r "$r" "$r.more"
  timeout -k 10 300 "$DTRAIN" train job.yaml --set output.dir="$r.more" --set train.epochs=3 \
    --set train.clip_norm=0.05 > "$r.more.out" 2>&1 || bad "resuming $r on 1 rank: $(tail -3 "$r.more.out")"
done
"$COMPARE" sh2.more/model.h5 fu2.more/model.h5 0 >/dev/null && ok \
  || bad "a sharded run's checkpoint lacks optimizer state: $("$COMPARE" sh2.more/model.h5 fu2.more/model.h5 0)"
"$COMPARE" sh2/model.h5 sh2.more/model.h5 0 >/dev/null && bad "the resumed run did not train" || ok

# --- bf16 gradients on the wire --------------------------------------------------
run w4 4 --set train.micro_batch=8 --set comm.grad_dtype=bf16 || bad "bf16 wire: $(tail -3 w4.out)"
grep -q "bf16 gradients all-reduced over mpi" w4/train.log && ok || bad "bf16 wire not logged"
same_losses b4 w4 5e-3 && ok || bad "bf16 wire losses far from fp32's: $(paste <(losses b4) <(losses w4) | tail -3)"
"$COMPARE" b4/model.h5 w4/model.h5 0 >/dev/null && bad "bf16 wire gave fp32's exact parameters" || ok
run x4 4 --set train.micro_batch=8 --set comm.grad_dtype=bf16 --set comm.bucket_mb=0.001 \
  || bad "bf16 wire, tiny buckets"
"$COMPARE" w4/model.h5 x4/model.h5 0 >/dev/null && ok || bad "bf16 wire: buckets changed the result"

# --- each rank reads its share ----------------------------------------------------
bytes=$(grep '"type":"summary"' b4/metrics.jsonl | sed 's/.*"train_bytes_read_per_rank":\[\([0-9,]*\)\].*/\1/')
one=$(grep '"type":"summary"' a1/metrics.jsonl | sed 's/.*"train_bytes_read_per_rank":\[\([0-9,]*\)\].*/\1/')
awk -v list="$bytes" -v one="$one" 'BEGIN { n = split(list, b, ","); if (n != 4) exit 1;
  for (i = 1; i <= n; i++) { r = b[i] / (one / 4); if (r < 0.95 || r > 1.05) exit 1 } }' \
  && ok || bad "bytes per rank [$bytes] are not about 1/4 of $one"

# --- short last batch, drop_last off -----------------------------------------------
# 1000 samples, global batch 36 over 4 ranks: 27 full batches and 28 left over
run g4 4 --set data.path=other.h5 --set data.drop_last=false --set train.global_batch=36 \
  --set train.epochs=1 || bad "short last batch: $(cat g4.out)"
samples=$(grep '"type":"summary"' g4/metrics.jsonl | sed 's/.*"samples":\([0-9]*\).*/\1/')
[ "$samples" = 1000 ] && ok || bad "an epoch of 1000 samples consumed $samples"
# 1001 samples, global batch 40 over 4 ranks in micro-batches of 5: 25 full
# batches and a last batch of 1 row, so ranks 0-2 get none (an empty
# micro-batch) and rank 3 gets it
tiny=(--set data.path=odd.h5 --set data.drop_last=false --set train.global_batch=40
      --set train.micro_batch=5 --set train.epochs=1)
run h4 4 "${tiny[@]}" || bad "tiny last batch: $(cat h4.out)"
run h1 1 "${tiny[@]}" || bad "tiny last batch, 1 rank: $(cat h1.out)"
samples=$(grep '"type":"summary"' h4/metrics.jsonl | sed 's/.*"samples":\([0-9]*\).*/\1/')
steps=$(grep '"type":"summary"' h4/metrics.jsonl | sed 's/.*"steps":\([0-9]*\).*/\1/')
[ "$samples" = 1001 ] && [ "$steps" = 26 ] && ok \
  || bad "tiny last batch: $samples samples in $steps steps, expected 1001 in 26"
# each full batch gives every rank 10 rows, so ranks 0-2 read 250 rows and
# rank 3 one more: bytes b, b, b and b * 251/250
bytes=$(grep '"type":"summary"' h4/metrics.jsonl | sed 's/.*"train_bytes_read_per_rank":\[\([0-9,]*\)\].*/\1/')
awk -v list="$bytes" 'BEGIN { n = split(list, b, ",");
  exit !(n == 4 && b[1] > 0 && b[1] == b[2] && b[2] == b[3] && b[4] * 250 == b[1] * 251) }' \
  && ok || bad "tiny last batch: bytes per rank [$bytes], expected ranks 0-2 equal, rank 3 one row more"
same_losses h1 h4 1e-5 && ok || bad "tiny last batch: losses 1 vs 4 ranks differ"
"$COMPARE" h1/model.h5 h4/model.h5 1e-5 >/dev/null && ok || bad "short last batch differs 1 vs 4 ranks"

# --- bad input and failures ------------------------------------------------------------
expect_fail 64 "smaller than the 4 ranks" 4 --set train.global_batch=2
expect_fail 64 "multiple of 3 such as 30 or 33" 3
expect_fail 64 "micro_batch=3 does not divide the 8 samples" 4 --set train.micro_batch=3
FAULT=1:open expect_fail 66 "rank 1: .*DTRAIN_FAULT" 2
FAULT=2:nomem expect_fail 75 "rank 2: out of memory" 4
FAULT=1:read:5 expect_fail 74 "rank 1: reading a training batch failed" 2
# ranks that disagree on the job or the data (MPMD launch)
out=$(timeout -k 10 120 $MPIRUN 1 "$DTRAIN" train job.yaml --set output.dir=mp : \
      -np 1 "$DTRAIN" train job.yaml --set output.dir=mp --set train.seed=7 2>&1); rc=$?
[ "$rc" = 64 ] && grep -q "rank 1: the job differs from rank 0's: train.seed=7 (rank 0: 42)" <<<"$out" \
  && ok || bad "job disagreement: exit $rc: $out"
out=$(timeout -k 10 120 $MPIRUN 1 "$DTRAIN" train job.yaml --set output.dir=mp : \
      -np 1 "$DTRAIN" train job.yaml --set output.dir=mp --set data.path=other.h5 2>&1); rc=$?
[ "$rc" = 65 ] && grep -q "rank 1: the dataset differs from rank 0's" <<<"$out" \
  && ok || bad "dataset disagreement: exit $rc: $out"

# a rank killed mid-training: the job ends (non-zero), nobody hangs
timeout -k 10 120 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=killed --set train.epochs=200 \
  > killed.out 2>&1 &
launcher=$!
victim=""
for _ in $(seq 1 100); do
  for pid in $(pgrep -x dtrain); do # a rank of this job, not mpirun or timeout
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "output.dir=killed" && victim=$pid
  done
  [ -n "$victim" ] && grep -q "step" killed.out 2>/dev/null && break
  sleep 0.1
done
if [ -n "$victim" ] && [ "$victim" != "$launcher" ]; then
  kill -9 "$victim"
  wait "$launcher"; rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && ok || bad "after kill -9 of a rank the job exited $rc"
else
  bad "no rank process found to kill"
  wait "$launcher"
fi

echo "mpi_train: $pass passed, $fail failed"
[ "$fail" = 0 ]
