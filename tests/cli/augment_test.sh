#!/usr/bin/env bash
# Image inputs end to end: .npy images of (N, C, H, W) get per-channel
# normalisation at import and data info shows it; (N, H, W) is read as
# (1, H, W); training with data.augment.crop_padding and data.augment.hflip
# gives the same training on 1 and 2 ranks and with accumulation (up to
# the order of float sums) and a different one without augmentation; evaluation never augments (the same test
# loss with the keys set or not); augmentation of vector samples is
# refused with 64 naming the key.
#   augment_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1
COMPARE=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() {
  local code=$1 pat=$2; shift 3
  local out rc
  out=$(timeout 300 "$@" 2>&1); rc=$?
  if [ "$rc" != "$code" ]; then bad "'$*' exited $rc, expected $code: $out"; return; fi
  if ! grep -qE -- "$pat" <<<"$out"; then bad "'$*' output lacks /$pat/: $out"; return; fi
  ok
}

# Images whose class is their brightest channel, written as .npy in plain
# Python (the format byte for byte, no numpy needed); vectors for the
# refusal.
python3 "$HERE/make_bright_npy.py" 7 384 96 || { echo "cannot make data"; exit 1; }

NPY="$DTRAIN data import npy"
expect 0 "per-channel normalisation of 3 channels" -- $NPY --train-x train_x.npy --train-y train_y.npy \
  --test-x test_x.npy --test-y test_y.npy -o img.h5
expect 0 "normalisation per channel c: \(v \* 0.00392157 - mean\[c\]\) / std\[c\], mean 0\.[0-9]+, 0\.[0-9]+, 0\.[0-9]+; std" \
  -- "$DTRAIN" data info img.h5
expect 0 "C x H x W = 3x8x8" -- "$DTRAIN" data info img.h5
expect 0 "normalisation mean" -- $NPY --train-x train_x1.npy --train-y train_y1.npy \
  --test-x test_x1.npy --test-y test_y1.npy -o gray.h5
expect 0 "C x H x W = 1x8x8" -- "$DTRAIN" data info gray.h5
"$DTRAIN" data info gray.h5 | grep -q "normalisation per channel" && bad "gray.h5 got per-channel attributes" || ok
expect 0 "wrote vec.h5" -- $NPY --train-x train_v.npy --train-y train_y.npy \
  --test-x test_v.npy --test-y test_y.npy -o vec.h5

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
  steps: 36
  global_batch: 32
  eval_batch: 96
  log_every: 6
  optimizer:
    lr: 0.003
  schedule:
    warmup_steps: 0
runtime:
  threads: 1
  progress: off
JOB

train() { local dir=$1; shift; timeout 300 "$@" train job.yaml --set output.dir="$dir" "${EXTRA[@]}" >"$dir.out" 2>&1; }
EXTRA=()
train one "$DTRAIN" || bad "1-rank augmented run failed: $(cat one.out)"
train two $MPIRUN 2 "$DTRAIN" || bad "2-rank augmented run failed: $(cat two.out)"
EXTRA=(--set train.micro_batch=8)
train acc "$DTRAIN" || bad "accumulated augmented run failed: $(cat acc.out)"
EXTRA=(--set data.augment.crop_padding=0 --set data.augment.hflip=false)
train plain "$DTRAIN" || bad "run without augmentation failed: $(cat plain.out)"
EXTRA=(--set data.augment.crop_padding=0)
train fliponly "$DTRAIN" || bad "flip-only run failed: $(cat fliponly.out)"

# The same samples get the same crops and flips on 2 ranks and with
# accumulation; only the order of float sums differs (relative 2e-7 here),
# while a run without augmentation differs by far more than the tolerance.
close_losses() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "train"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
sys.exit(0 if a and len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(a, b)) else 1)
PY
}
for d in two acc; do
  close_losses one $d && ok || bad "one and $d: training losses differ"
  "$COMPARE" one/model.h5 $d/model.h5 1e-5 >/dev/null && ok || bad "one and $d: parameters differ"
done
for d in plain fliponly; do
  "$COMPARE" one/model.h5 $d/model.h5 1e-2 >/dev/null 2>&1 && bad "one and $d: augmentation changed nothing" || ok
done
# a run that learned: the classes are easy even through crops and flips
acc=$(grep '"type":"summary"' one/metrics.jsonl | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" 2>/dev/null && ok ||
  bad "augmented run: test accuracy '$acc' below 0.9"

# evaluation never augments: the same test loss with the keys set or not
ck=$(ls one/checkpoints/*.h5 2>/dev/null | tail -1)
if [ -n "$ck" ]; then
  a=$(timeout 300 "$DTRAIN" eval job.yaml --checkpoint "$ck" --set output.dir=ev1 2>&1 | grep -o "test loss [0-9.]*.*")
  b=$(timeout 300 "$DTRAIN" eval job.yaml --checkpoint "$ck" --set output.dir=ev2 \
      --set data.augment.crop_padding=0 --set data.augment.hflip=false 2>&1 | grep -o "test loss [0-9.]*.*")
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "eval with and without augmentation keys: '$a' vs '$b'"
else
  bad "one: no checkpoint"
fi

# images of one channel (N, H, W) train as (1, H, W)
expect 0 "done: 36 steps" -- "$DTRAIN" train job.yaml --set data.path=gray.h5 --set output.dir=gray
# vectors refuse augmentation, naming the key
expect 64 "data.augment.hflip asks for augmentation of split 'train', whose samples \\(16\\) are not images" \
  -- "$DTRAIN" train job.yaml --set data.path=vec.h5 --set data.augment.crop_padding=0 --set output.dir=vec1
expect 64 "data.augment.crop_padding asks for augmentation" \
  -- "$DTRAIN" train job.yaml --set data.path=vec.h5 --set output.dir=vec2
expect 64 "data.augment.crop_padding" -- "$DTRAIN" train job.yaml --set data.augment.crop_padding=-1 --set output.dir=neg

echo "augment: $pass passed, $fail failed"
[ "$fail" = 0 ]
