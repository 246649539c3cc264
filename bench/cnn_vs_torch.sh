#!/usr/bin/env bash
# dtrain against PyTorch on a convolutional job's training step (default
# configs/fashion-mnist-cnn.yaml; also configs/fashion-mnist-resnet.yaml):
# the same model, batch 128, AdamW with weight decay on weights only, fp32,
# on one rank and the same thread count, measured in the same run.
#   bash bench/cnn_vs_torch.sh [JOB] [STEPS] [THREADS]
# Needs: build/ (launch/setup.sh), data/fashion-mnist.h5, python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
JOB=${1:-configs/fashion-mnist-cnn.yaml}
STEPS=${2:-300}
THREADS=${3:-1}
BUILD=${BUILD_DIR:-build}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
. bench/blas_env.sh
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT

# The model as the job resolves it (type, channels, blocks, hidden, dropout).
"$BUILD"/dtrain train "$JOB" --print-config > "$run/job.yaml"
key() { awk -v k="  $1:" 'index($0, k) == 1 { sub(k " *", ""); print; exit }' "$run/job.yaml"; }
list() { key "$1" | tr -d '[] '; }
type=$(key type)
OPENBLAS_NUM_THREADS=$THREADS "$BUILD"/dtrain train "$JOB" \
  --set train.steps="$STEPS" --set train.schedule.warmup_steps=0 \
  --set runtime.threads="$THREADS" --set runtime.progress=off \
  --set output.dir="$run/dt" --set train.log_every=1000000 --set output.tensorboard=false >/dev/null
dt_sps=$(grep '"type":"summary"' "$run/dt/metrics.jsonl" | sed 's/.*"samples_per_s":\([0-9.]*\).*/\1/')
dt_gf=$(grep '"type":"summary"' "$run/dt/metrics.jsonl" | sed 's/.*"gflops":\([0-9.]*\).*/\1/')

OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS \
  "$PY" bench/torch_cnn.py /usr/share/datasets/fashion-mnist "$STEPS" "$THREADS" 128 "$type" \
  "$(list channels)" "$(list blocks)" "$(list hidden)" "$(key dropout)" > "$run/torch.txt"
th_sps=$(awk '/torch_samples_per_s/ {print $2}' "$run/torch.txt")

printf '%-34s %12s\n' "$(basename "$JOB" .yaml), b=128" "samples/s"
printf '%-34s %12.0f\n' "dtrain ($THREADS thread)" "$dt_sps"
printf '%-34s %12.0f\n' "PyTorch ($THREADS thread)" "$th_sps"
awk -v a="$dt_sps" -v b="$th_sps" 'BEGIN { printf "ratio dtrain/PyTorch                %12.2f\n", a / b }'
printf '%-34s %12.2f\n' "dtrain achieved GFLOP/s" "$dt_gf"
