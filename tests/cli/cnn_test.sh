#!/usr/bin/env bash
# Convolutional models end to end, on a small learnable image dataset
# (12x12 one-channel images: the class is the quadrant pattern planted in
# them), imported with `dtrain data import npy`:
#   - --print-config shows the layer list a family expands into;
#   - a cnn and a resnet train and learn (test accuracy well above chance);
#   - model.h5 holds the running statistics of the final checkpoint;
#   - model.recompute gives bit-identical parameters, with the activation
#     memory of both ways in the log and metrics.jsonl;
#   - model.sync_bn on 2 ranks gives the parameters of 1 rank (to float
#     rounding), and without it they differ more;
#   - a 2-rank checkpoint (with batch norm's running statistics) resumes on
#     1 rank with the result of an uninterrupted 2-rank run (sync_bn, so
#     the statistics do not depend on the split);
#   - a layer list with mistakes is refused with exit 64 naming the entry.
#   cnn_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1
COMPARE=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
source "$HERE/lib.sh"
acc() { grep '"type":"summary"' "$1/metrics.jsonl" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/'; }

"$PY" - <<'PYEOF' || { echo "cannot write the npy files"; exit 1; }
import numpy as np
rng = np.random.default_rng(3)
def make(n):
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 60, (n, 12, 12)).astype(np.uint8)
    for i, c in enumerate(y):  # a bright 5x5 patch in the class's quadrant
        r, q = divmod(int(c), 2)
        x[i, 1 + 6 * r:6 + 6 * r, 1 + 6 * q:6 + 6 * q] += 150
    return x, y.astype(np.int32)
for split, n in (("train", 1024), ("test", 256)):
    x, y = make(n)
    np.save(f"{split}_x.npy", x)
    np.save(f"{split}_y.npy", y)
PYEOF
"$DTRAIN" data import npy --train-x train_x.npy --train-y train_y.npy --test-x test_x.npy \
  --test-y test_y.npy -o img.h5 >/dev/null || { echo "import failed"; exit 1; }

cat > cnn.yaml <<'YEOF'
model:
  type: cnn
  channels: [6, 8]
  hidden: [16]
  dropout: 0.1
data:
  path: img.h5
  workers: 1
train:
  epochs: 3
  global_batch: 32
  seed: 7
  log_every: 10
  optimizer:
    name: adamw
    lr: 0.01
  schedule:
    name: cosine
    warmup_steps: 0
runtime:
  threads: 1
  progress: off
output:
  tensorboard: false
YEOF

# --print-config: the expansion
expect 0 '^#     - \{name: stage1.conv, kind: conv2d, out: 6, kernel: 3, padding: 1, bias: false\}' \
  -- "$DTRAIN" train cnn.yaml --print-config
expect 0 'stage2.block1, kind: residual, out: 32, stride: 2' \
  -- "$DTRAIN" train cnn.yaml --print-config --set model.type=resnet --set model.channels=[16,32]

# cnn learns; recompute is bit-identical
expect 0 'activation memory .* per rank' -- "$DTRAIN" train cnn.yaml --set output.dir=plain
a=$(acc plain)
awk -v a="$a" 'BEGIN { exit !(a >= 0.9) }' && ok || bad "cnn test accuracy $a, expected >= 0.9"
# model.h5 holds batch norm's running statistics as the final checkpoint does
last=$(ls plain/checkpoints/ckpt-*.h5 | tail -n 1)
h5dump -d /params/stage1.bn.running_var -b LE -o m.bin plain/model.h5 >/dev/null &&
  h5dump -d /buffers/stage1.bn.running_var -b LE -o c.bin "$last" >/dev/null &&
  [ -s m.bin ] && cmp -s m.bin c.bin && ok ||
  bad "model.h5's stage1.bn.running_var is not the final checkpoint's"
expect 0 'model.recompute: all; .* without recomputation' \
  -- "$DTRAIN" train cnn.yaml --set output.dir=rc --set model.recompute=all
"$COMPARE" plain/model.h5 rc/model.h5 0 >/dev/null && ok || bad "recompute changed the parameters"
grep -q '"activation_bytes":' rc/metrics.jsonl && ok || bad "no activation_bytes in metrics.jsonl"
b1=$(grep -o '"activation_bytes":[0-9]*' rc/metrics.jsonl | head -1 | cut -d: -f2)
b2=$(grep -o '"activation_bytes_without_recompute":[0-9]*' rc/metrics.jsonl | head -1 | cut -d: -f2)
[ -n "$b1" ] && [ -n "$b2" ] && [ "$b1" -lt "$b2" ] && ok ||
  bad "recompute did not lower the activation memory ($b1 vs $b2)"

# resnet learns
expect 0 'done:' -- "$DTRAIN" train cnn.yaml --set output.dir=res --set model.type=resnet \
  --set model.channels=[8,16] --set model.blocks=[1,1]
a=$(acc res)
awk -v a="$a" 'BEGIN { exit !(a >= 0.9) }' && ok || bad "resnet test accuracy $a, expected >= 0.9"

# sync_bn: 2 ranks as 1 rank; without it, further apart
S="--set train.epochs=1 --set model.dropout=0"
expect 0 'done:' -- "$DTRAIN" train cnn.yaml $S --set output.dir=one --set model.sync_bn=true
expect 0 'done:' -- $MPIRUN 2 "$DTRAIN" train cnn.yaml $S --set output.dir=two_sync \
  --set model.sync_bn=true
expect 0 'done:' -- $MPIRUN 2 "$DTRAIN" train cnn.yaml $S --set output.dir=two_local
"$COMPARE" one/model.h5 two_sync/model.h5 1e-3 >/dev/null && ok ||
  bad "sync_bn on 2 ranks differs from 1 rank: $("$COMPARE" one/model.h5 two_sync/model.h5 1e-3)"
"$COMPARE" one/model.h5 two_local/model.h5 1e-3 >/dev/null &&
  bad "without sync_bn 2 ranks match 1 rank within 1e-3: the statistics are not per rank" || ok

# a 2-rank checkpoint resumes on 1 rank, running statistics included
expect 0 'done:' -- $MPIRUN 2 "$DTRAIN" train cnn.yaml --set output.dir=full \
  --set checkpoint.every_steps=40 --set model.sync_bn=true
mkdir -p part/checkpoints && cp full/checkpoints/ckpt-0000000040.h5 part/checkpoints/ &&
  cp full/config.yaml part/ 2>/dev/null
expect 0 'resumed from .*ckpt-0000000040.h5' -- "$DTRAIN" train cnn.yaml --set output.dir=part \
  --set output.adopt=true --set model.sync_bn=true --resume part/checkpoints/ckpt-0000000040.h5
"$COMPARE" full/model.h5 part/model.h5 1e-3 >/dev/null && ok ||
  bad "resumed on 1 rank differs: $("$COMPARE" full/model.h5 part/model.h5 1e-3)"
h5ls -r full/checkpoints/ckpt-0000000040.h5 | grep -q 'buffers/stage1.bn.running_mean' && ok ||
  bad "the checkpoint lacks the running statistics"

# mistakes in a layer list
cat > bad.yaml <<'YEOF'
model:
  type: layers
  layers:
    - {name: c, kind: conv2d, out: 4, kernel: 15}
data:
  path: img.h5
YEOF
expect 64 'model.layers\[0\] \(c\): a 15x15 kernel \(dilation 1\) does not fit the 12x12 input' \
  -- "$DTRAIN" train bad.yaml --set output.dir=bad
sed -i 's/kernel: 15/kernel: 3, stride: two/' bad.yaml
expect 64 'model.layers\[0\] \(c\): stride: expected an integer' \
  -- "$DTRAIN" train bad.yaml --set output.dir=bad2
[ ! -e bad/model.h5 ] && ok || bad "a refused job left a model"

echo "cnn: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
