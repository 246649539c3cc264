#!/usr/bin/env bash
# dtrain against PyTorch on the quick-start MLP (784-512-512-10, batch 128,
# AdamW, fp32, dropout 0.1) on one thread, measured in the same run, plus
# dtrain's achieved GFLOP/s beside OpenBLAS sgemm at the same GEMM shapes.
#   bash bench/mlp_vs_torch.sh [STEPS] [THREADS]
# Needs: build/ (launch/setup.sh), data/fashion-mnist.h5, python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-1500}
THREADS=${2:-1}
BUILD=${BUILD_DIR:-build}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
. bench/blas_env.sh
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT

# Both sides keep the data loader off the compute thread budget's critical
# path in their own way; BLAS runs on THREADS threads in both.
OPENBLAS_NUM_THREADS=$THREADS "$BUILD"/dtrain train configs/fashion-mnist-mlp.yaml \
  --set train.steps="$STEPS" --set runtime.threads="$THREADS" --set runtime.progress=off \
  --set output.dir="$run" --set train.log_every=1000000 >/dev/null
dt_sps=$(grep '"type":"summary"' "$run/metrics.jsonl" | sed 's/.*"samples_per_s":\([0-9.]*\).*/\1/')
dt_gf=$(grep '"type":"summary"' "$run/metrics.jsonl" | sed 's/.*"gflops":\([0-9.]*\).*/\1/')

OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS \
  "$PY" bench/torch_mlp.py /usr/share/datasets/fashion-mnist "$STEPS" "$THREADS" 128 > "$run/torch.txt"
th_sps=$(awk '/torch_samples_per_s/ {print $2}' "$run/torch.txt")

sg=$("$BUILD"/bench/bench_sgemm 128 "$THREADS" 3 784 512 512 10 | awk '{print $2}')

printf '%-28s %12s\n' "MLP 784-512-512-10, b=128" "samples/s"
printf '%-28s %12.0f\n' "dtrain ($THREADS thread)" "$dt_sps"
printf '%-28s %12.0f\n' "PyTorch ($THREADS thread)" "$th_sps"
awk -v a="$dt_sps" -v b="$th_sps" 'BEGIN { printf "ratio dtrain/PyTorch          %12.2f\n", a / b }'
printf '%-28s %12.2f\n' "dtrain achieved GFLOP/s" "$dt_gf"
printf '%-28s %12.2f\n' "OpenBLAS sgemm GFLOP/s" "$sg"
awk -v a="$dt_gf" -v b="$sg" 'BEGIN { printf "dtrain / sgemm ceiling       %12.2f\n", a / b }'
