#!/usr/bin/env bash
# data.cache end to end on 2 ranks, with crop and flip augmentation:
#   - memory, the split within data.cache_max_mb: cached whole, the same
#     parameters as none bit for bit;
#   - memory, the split over data.cache_max_mb: each rank caches its own
#     shard (the log says so), training differs from none (other batches),
#     each rank reads half of the split from the file, and a run resumed
#     from its checkpoint ends bit-identical to the run that never stopped;
#   - a shard over data.cache_max_mb (1 rank) and a bad data.cache value
#     are refused with 64 naming the key.
#   cache_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1
COMPARE=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
source "$HERE/lib.sh"

# 6000 uint8 images of 3 x 8 x 8 whose class is their brightest channel:
# 1.2 MB cached whole (2 MiB rounded up), 0.6 MB per rank as shards.
python3 "$HERE/make_bright_npy.py" 11 6000 96 || { echo "cannot make data"; exit 1; }
expect 0 "wrote img.h5" -- "$DTRAIN" data import npy --train-x train_x.npy --train-y train_y.npy \
  --test-x test_x.npy --test-y test_y.npy -o img.h5

cat > job.yaml <<JOB
model:
  hidden: [32]
  dropout: 0
data:
  path: img.h5
  workers: 2
  prefetch: 3
  augment:
    crop_padding: 2
    hflip: true
train:
  steps: 40
  global_batch: 32
  eval_batch: 96
  log_every: 10
  optimizer:
    lr: 0.003
  schedule:
    warmup_steps: 0
checkpoint:
  every_steps: 20
runtime:
  threads: 1
  progress: off
JOB

run2() { local dir=$1; shift; timeout 300 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir="$dir" "$@" >"$dir.out" 2>&1; }
run2 none --set data.cache=none || bad "2 ranks, cache none failed: $(cat none.out)"
run2 whole --set data.cache=memory || bad "2 ranks, cache memory failed: $(cat whole.out)"
run2 shard --set data.cache=memory --set data.cache_max_mb=1 ||
  bad "2 ranks, cache memory in shards failed: $(cat shard.out)"

grep -q "cached split 'train' in memory: 6000 rows" whole.out && ok || bad "whole: no cache line: $(cat whole.out)"
"$COMPARE" none/model.h5 whole/model.h5 0 >/dev/null && ok ||
  bad "cache memory (whole split) differs from none: $("$COMPARE" none/model.h5 whole/model.h5 0)"
grep -q "each rank caches its own shard (3000 rows here" shard.out && ok ||
  bad "shard: no shard warning: $(cat shard.out)"
"$COMPARE" none/model.h5 shard/model.h5 0 >/dev/null 2>&1 &&
  bad "cache memory in shards trained exactly as none: the batches did not change" || ok

# bytes each rank read from the file: the whole split (6000 x 192) when
# cached whole, its half when cached as shards
reads() { grep -o '"train_bytes_read_per_rank":\[[0-9, ]*\]' "$1/metrics.jsonl" | tail -1 | sed 's/.*\[//; s/\]//; s/ //g'; }
[ "$(reads whole)" = "1152000,1152000" ] && ok || bad "whole: bytes read per rank $(reads whole), expected 1152000,1152000"
[ "$(reads shard)" = "576000,576000" ] && ok || bad "shard: bytes read per rank $(reads shard), expected 576000,576000"

# a run resumed from the shard run's step-20 checkpoint ends the same
mkdir -p part/checkpoints && cp shard/checkpoints/ckpt-0000000020.h5 part/checkpoints/ &&
  cp shard/config.yaml part/ 2>/dev/null
run2 part --set data.cache=memory --set data.cache_max_mb=1 --set output.adopt=true \
  --resume part/checkpoints/ckpt-0000000020.h5 || bad "shard resume failed: $(cat part.out)"
grep -q "resumed from .*ckpt-0000000020.h5" part.out && ok || bad "part did not resume: $(cat part.out)"
"$COMPARE" shard/model.h5 part/model.h5 0 >/dev/null && ok ||
  bad "resumed shard run differs: $("$COMPARE" shard/model.h5 part/model.h5 0)"

expect 64 "needs 2 MiB, more than data.cache_max_mb=1" -- "$DTRAIN" train job.yaml \
  --set data.cache=memory --set data.cache_max_mb=1 --set output.dir=big
expect 64 "data.cache: expected one of none, memory, got 'disk'" -- "$DTRAIN" train job.yaml \
  --set data.cache=disk --set output.dir=disk

echo "cache: $pass passed, $fail failed"
[ "$fail" = 0 ]
