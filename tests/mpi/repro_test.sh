#!/usr/bin/env bash
# train.reproducible: the same bits on 1, 2 and 4 ranks and with any
# accumulation that keeps the shard size, under real mpirun.
#   - the quick-start job (configs/fashion-mnist-mlp.yaml, dropout), 2 full
#     epochs, shards of 32 rows: 1 rank, 2 ranks, 4 ranks and 2 ranks with
#     micro-batches of 32 (accumulation 2) end with the same model.h5 bit
#     for bit, and metrics.jsonl's losses (every training window and every
#     evaluation) are the same text;
#   - configs/fashion-mnist-cnn.yaml (batch norm, flips) shortened to 60
#     steps with model.sync_bn: the same on 1, 2, 4 and 2 ranks with
#     accumulation, running statistics included;
#   - the tiny GPT (configs/text-gpt-tiny.yaml, gradient clipping) on text
#     made from this repository's docs: the same on 1, 2, 4 and 2 ranks with
#     accumulation;
#   - a run checkpointed on 4 ranks, killed, and resumed on 2 ends bit for
#     bit where the uninterrupted 1-rank run ends;
#   - a 3-rank run (3 shards) against 1 rank; an epoch whose short last
#     batch ends inside a shard and leaves a rank without rows, 1 vs 4 ranks;
#   - the default mode on 1 and 2 ranks does differ (so the comparisons can
#     fail), and what the mode cannot honour is refused: a world size that
#     leaves each rank a number of shards that is not a power of two,
#     comm.shard optimizer, bf16 gradients on the wire.
# DTRAIN_REPRO_QUICK=1 (the sanitizer build) runs the same comparisons
# shorter: the MLP 1 epoch, the CNN 20 steps, the GPT 8 (24 otherwise).
#   repro_test.sh DTRAIN COMPARE_MODELS SOURCE_DIR WORKDIR
set -uo pipefail
DTRAIN=$1 COMPARE=$2 SRC=$3 W=$4
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/mpirun.sh"
DATA="$SRC/data/fashion-mnist.h5"
if [ ! -f "$DATA" ]; then
  echo "SKIP: $DATA not imported (run launch/setup.sh)"
  exit 77
fi
export OMPI_MCA_btl=self,vader
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
run() { # NP JOB DIR [--set ...]
  local np=$1 job=$2 dir=$3
  shift 3
  timeout -k 10 900 $MPIRUN "$np" "$DTRAIN" train "$job" --set output.dir="$dir" \
    --set runtime.progress=off "$@" > "$dir.out" 2>&1
}
losses() { grep -E '"type":"(train|eval)"' "$1/metrics.jsonl" | grep -o '"type":"[a-z]*"\|"step":[0-9]*\|"loss":[^,]*' | paste -sd' '; }
same() { # A B what: model.h5 bit for bit and the losses as text
  if "$COMPARE" "$1/model.h5" "$2/model.h5" 0 > cmp.out && diff <(losses "$1") <(losses "$2") > /dev/null; then ok
  else bad "$3: $(head -2 cmp.out) $(diff <(losses "$1") <(losses "$2") | head -3)"; fi
}
R="--set train.reproducible=true --set runtime.threads=1 --set data.path=$DATA"

# epochs of the MLP, steps of the CNN and of the GPT
E=2 CS=60 GS=24
[ "${DTRAIN_REPRO_QUICK:-0}" = 1 ] && E=1 CS=20 GS=8

# the quick-start job, 2 full epochs
MLP="$SRC/configs/fashion-mnist-mlp.yaml"
run 1 "$MLP" m1 $R --set train.epochs=$E --set train.shard_rows=32 || { cat m1.out; exit 1; }
grep -q "train.reproducible: 4 shards of 32 rows per step" m1.out && ok || bad "no plan line: $(grep repro m1.out)"
run 2 "$MLP" m2 $R --set train.epochs=$E --set train.shard_rows=32 && same m1 m2 "MLP 1 vs 2 ranks" || bad "MLP 2 ranks: $(tail -2 m2.out)"
run 4 "$MLP" m4 $R --set train.epochs=$E --set train.shard_rows=32 && same m1 m4 "MLP 1 vs 4 ranks" || bad "MLP 4 ranks: $(tail -2 m4.out)"
run 2 "$MLP" m2a $R --set train.epochs=$E --set train.shard_rows=32 --set train.micro_batch=32 \
  && same m1 m2a "MLP 1 rank vs 2 ranks with accumulation 2" || bad "MLP accumulation: $(tail -2 m2a.out)"
[ "$(grep -c '"type":"eval"' m1/metrics.jsonl)" = "$E" ] && ok || bad "expected $E evaluations in m1"

# a world size that is not a power of two: 3 ranks, one shard each
T="$R --set train.steps=60 --set train.schedule.warmup_steps=10 --set train.shard_rows=32 --set train.global_batch=96"
run 1 "$MLP" t1 $T && run 3 "$MLP" t3 $T && same t1 t3 "MLP 1 vs 3 ranks" || bad "3 ranks: $(tail -2 t3.out)"

# the short last batch of an epoch (data.drop_last false): 60000 = 535 x 112
# + 80 rows, shards 28, 28 and 24 rows; on 4 ranks rank 3 has none of them
B="$R --set train.epochs=1 --set train.global_batch=112 --set train.shard_rows=28 --set data.drop_last=false"
run 1 "$MLP" b1 $B && run 4 "$MLP" b4 $B && same b1 b4 "short last batch, 1 vs 4 ranks" || bad "short last batch: $(tail -2 b4.out)"

# the default mode differs between world sizes (the comparison can fail)
D="--set runtime.threads=1 --set data.path=$DATA --set train.steps=60 --set train.schedule.warmup_steps=10"
run 1 "$MLP" d1 $D && run 2 "$MLP" d2 $D || bad "default runs failed: $(tail -2 d2.out)"
"$COMPARE" d1/model.h5 d2/model.h5 0 > /dev/null && bad "the default mode gave the same bits on 1 and 2 ranks" || ok

# the CNN with batch norm, flips and model.sync_bn
CNN="$SRC/configs/fashion-mnist-cnn.yaml"
C="$R --set train.steps=$CS --set train.schedule.warmup_steps=10 --set train.shard_rows=32 --set model.sync_bn=true --set train.eval_batch=2000"
run 1 "$CNN" c1 $C || { cat c1.out; exit 1; }
grep -q "model.sync_bn adds nothing" c1.out && ok || bad "no sync_bn line"
run 2 "$CNN" c2 $C && same c1 c2 "CNN 1 vs 2 ranks" || bad "CNN 2 ranks: $(tail -2 c2.out)"
run 4 "$CNN" c4 $C && same c1 c4 "CNN 1 vs 4 ranks" || bad "CNN 4 ranks: $(tail -2 c4.out)"
run 2 "$CNN" c2a $C --set train.micro_batch=32 && same c1 c2a "CNN accumulation 2" || bad "CNN accumulation: $(tail -2 c2a.out)"

# the tiny GPT on this repository's docs
"$DTRAIN" data import text "$SRC"/docs/*.md -o text.h5 > import.out 2>&1 || { cat import.out; exit 1; }
GPT="$SRC/configs/text-gpt-tiny.yaml"
G="$R --set data.path=text.h5 --set train.steps=$GS --set train.schedule.warmup_steps=4 --set train.shard_rows=4 --set train.eval_batch=64"
run 1 "$GPT" g1 $G || { cat g1.out; exit 1; }
run 2 "$GPT" g2 $G && same g1 g2 "GPT 1 vs 2 ranks" || bad "GPT 2 ranks: $(tail -2 g2.out)"
run 4 "$GPT" g4 $G && same g1 g4 "GPT 1 vs 4 ranks" || bad "GPT 4 ranks: $(tail -2 g4.out)"
run 2 "$GPT" g2a $G --set train.micro_batch=4 && same g1 g2a "GPT accumulation" || bad "GPT accumulation: $(tail -2 g2a.out)"

# checkpointed on 4 ranks, killed, resumed on 2: the 1-rank run's bits
K="$R --set train.steps=200 --set train.schedule.warmup_steps=20 --set train.shard_rows=32 --set checkpoint.every_steps=50"
run 1 "$MLP" k1 $K || bad "k1: $(tail -2 k1.out)"
DTRAIN_FAULT=2:kill:120 run 4 "$MLP" k42 $K && bad "the killed run did not fail"
ls k42/checkpoints/ckpt-0000000100.h5 > /dev/null 2>&1 && ok || bad "no checkpoint of step 100: $(ls k42/checkpoints)"
mv k42.out k42-first.out
run 2 "$MLP" k42 $K && grep -q "resum" k42.out && same k1 k42 "resumed 4 -> 2 ranks vs 1 rank" \
  || bad "resume on 2 ranks: $(grep -i 'resum\|error' k42.out | head -3)"

# refusals
run 2 "$MLP" r3 $R --set train.shard_rows=32 --set train.global_batch=192
[ $? = 64 ] && grep -q "must split into a power of two per rank.*same bits on 1, 3, 6 ranks" r3.out && ok \
  || bad "2 ranks with 3 shards each: $(grep -i error r3.out | head -2)"
run 2 "$MLP" r4 $R --set train.shard_rows=32 --set comm.shard=optimizer
[ $? = 64 ] && grep -q "comm.shard: optimizer splits it" r4.out && ok || bad "comm.shard optimizer: $(grep -i error r4.out | head -2)"
run 2 "$MLP" r5 $R --set train.shard_rows=32 --set comm.grad_dtype=bf16
[ $? = 64 ] && grep -q "comm.grad_dtype: bf16 would round" r5.out && ok || bad "bf16 wire: $(grep -i error r5.out | head -2)"
run 1 "$MLP" r6 $R --set train.shard_rows=48
[ $? = 64 ] && grep -q "train.shard_rows (48) must divide train.global_batch (128)" r6.out && ok || bad "shard_rows 48: $(grep -i error r6.out | head -2)"

run 1 "$MLP" r7 --set train.reproducible=true --set data.path="$DATA" --set train.shard_rows=32
[ $? = 64 ] && grep -q "train.reproducible needs a fixed runtime.threads" r7.out && ok || bad "threads 0: $(grep -i error r7.out | head -2)"

echo "repro: $pass passed, $fail failed"
[ "$fail" = 0 ]
