#!/usr/bin/env bash
# The quick-start job (configs/fashion-mnist-mlp.yaml) must reach at least
# 88.5% test accuracy on Fashion-MNIST within its 10 epochs.
#   accuracy_test.sh DTRAIN SOURCE_DIR WORKDIR
set -uo pipefail
DTRAIN=$1 SRC=$2 W=$3
DATA="$SRC/data/fashion-mnist.h5"
if [ ! -f "$DATA" ]; then
  echo "SKIP: $DATA not imported (run launch/setup.sh)"
  exit 77
fi
rm -rf "$W"
"$DTRAIN" train "$SRC/configs/fashion-mnist-mlp.yaml" --set data.path="$DATA" \
  --set output.dir="$W" --set runtime.progress=lines || exit 1
acc=$(grep '"type":"summary"' "$W/metrics.jsonl" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
echo "final test accuracy: $acc (required: 0.885)"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.885) }'
