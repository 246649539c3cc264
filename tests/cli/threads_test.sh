#!/usr/bin/env bash
# The thread count changes no bits: an MLP, a CNN with batch norm, dropout
# and flips, and a GPT with dropout train on 1 and on 3 threads (the pool
# then shares every op that has enough work: these shapes are above the
# sizes where ops start to split) and end with identical parameters
# (compare_models at tolerance 0) and identical logged losses. Then the
# BLAS kernels: never older than the CPU's AVX2/AVX-512.
#   threads_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1
COMPARE=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
source "$HERE/lib.sh"

"$PY" - <<'PYEOF' || { echo "cannot write the npy files"; exit 1; }
import numpy as np
rng = np.random.default_rng(5)
def make(n):
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 60, (n, 16, 16)).astype(np.uint8)
    for i, c in enumerate(y):
        r, q = divmod(int(c), 2)
        x[i, 2 + 8 * r:7 + 8 * r, 2 + 8 * q:7 + 8 * q] += 150
    return x, y.astype(np.int32)
for split, n in (("train", 2048), ("test", 256)):
    x, y = make(n)
    np.save(f"{split}_x.npy", x)
    np.save(f"{split}_y.npy", y)
PYEOF
"$DTRAIN" data import npy --train-x train_x.npy --train-y train_y.npy --test-x test_x.npy \
  --test-y test_y.npy -o img.h5 >/dev/null || { echo "import failed"; exit 1; }
"$PY" "$HERE/../common/corpus.py" >corpus.txt || { echo "tests/common/corpus.py failed"; exit 1; }
"$DTRAIN" data import text corpus.txt -o text.h5 >/dev/null || { echo "text import failed"; exit 1; }

cat > mlp.yaml <<'YEOF'
model: {type: mlp, hidden: [384, 256], dropout: 0.1}
data: {path: img.h5, workers: 1}
train:
  steps: 24
  global_batch: 128
  log_every: 4
  optimizer: {name: adamw, lr: 0.002, weight_decay: 0.01}
runtime: {progress: off}
YEOF
cat > cnn.yaml <<'YEOF'
model: {type: cnn, channels: [16, 32], hidden: [64], dropout: 0.1}
data: {path: img.h5, workers: 1, augment: {hflip: true}}
train:
  steps: 12
  global_batch: 64
  log_every: 4
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
runtime: {progress: off}
YEOF
cat > gpt.yaml <<'YEOF'
model: {type: gpt, n_layer: 2, n_head: 4, n_embd: 64, dropout: 0.1}
data: {path: text.h5, test_split: val, seq_len: 64}
train:
  steps: 12
  global_batch: 16
  eval_batch: 64
  log_every: 4
  optimizer: {name: adamw, lr: 0.003, weight_decay: 0.1}
runtime: {progress: off}
YEOF

losses() { grep '"type":"train"' "$1/metrics.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*"grad_norm":\([0-9.e+-]*\).*/\1 \2/'; }
for job in mlp cnn gpt; do
  for t in 1 3; do
    expect 0 'done:' -- "$DTRAIN" train $job.yaml --set output.dir=$job$t --set runtime.threads=$t
  done
  "$COMPARE" $job"1"/model.h5 $job"3"/model.h5 0 >/dev/null && ok ||
    bad "$job: 3 threads end with other parameters than 1: $("$COMPARE" $job"1"/model.h5 $job"3"/model.h5 0 | head -5)"
  [ -n "$(losses $job"1")" ] && [ "$(losses $job"1")" = "$(losses $job"3")" ] && ok ||
    bad "$job: logged losses differ: $(losses $job"1" | head -2) / $(losses $job"3" | head -2)"
done

# OpenBLAS's kernels fit the CPU: on a CPU whose /proc/cpuinfo flags have
# AVX2 and FMA, the OpenBLAS dtrain runs never has kernels from before AVX2
# (OpenBLAS picks those for a CPU model it does not know; dtrain then
# starts again with OPENBLAS_CORETYPE set and says so), and a user's
# OPENBLAS_CORETYPE is kept as it is.
blas=$(env -u OPENBLAS_CORETYPE -u DTRAIN_BLAS_FALLBACK "$DTRAIN" version | sed -n 's/^blas: //p')
core=$(sed -n 's/.*DYNAMIC_ARCH.* \([A-Za-z0-9_]*\) MAX_THREADS=.*/\1/p' <<<"$blas")
if [ -z "$core" ]; then
  echo "skip: the BLAS is not an OpenBLAS built for many CPUs ($blas)"
elif ! grep -m1 '^flags' /proc/cpuinfo | grep -qw avx2 || ! grep -m1 '^flags' /proc/cpuinfo | grep -qw fma; then
  echo "skip: this CPU has no AVX2 and FMA (OpenBLAS runs $core)"
else
  case $core in
  Prescott|Core2|Penryn|Dunnington|Nehalem|Sandybridge|Atom|Nano|Katmai|Coppermine|Northwood|Banias|Athlon|Opteron|Opteron_SSE3|Barcelona|Bobcat)
    bad "OpenBLAS runs its $core kernels on a CPU with AVX2 and FMA: $blas" ;;
  *) ok ;;
  esac
  echo "OpenBLAS kernels here: $core${blas##*MAX_THREADS=[0-9]*)}"
  kept=$(OPENBLAS_CORETYPE=Prescott "$DTRAIN" version | sed -n 's/^blas: //p')
  grep -q ' Prescott MAX_THREADS=' <<<"$kept" && ! grep -q 'set by dtrain' <<<"$kept" && ok ||
    bad "OPENBLAS_CORETYPE=Prescott was not kept: $kept"
fi

echo "threads: $pass passed, $fail failed"
[ "$fail" = 0 ]
