#!/usr/bin/env bash
# The quick-start MLP's achieved GFLOP/s against OpenBLAS sgemm's at the
# same GEMM shapes (bench/bench_sgemm), the two alternating for ROUNDS
# rounds on THREADS threads, with each round's ratio, their median and
# range. Two figures of dtrain per round:
#   - steady: the training steps after the first log window, as a long run
#     spends most of its time (sgemm's figure is also taken after a
#     warm-up call);
#   - whole run: the summary line's, start-up and the first steps included
#     (evaluation is left out of both).
# The run stays inside the first epoch (STEPS below 469), so no window
# holds an evaluation; the last window is left out (the final one does).
#   bash bench/mlp_sgemm.sh [ROUNDS] [STEPS] [THREADS]
# Needs: build/ (launch/setup.sh), data/fashion-mnist.h5.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
STEPS=${2:-440}
THREADS=${3:-1}
BUILD=${BUILD_DIR:-build}
EVERY=20
. bench/blas_env.sh
if [ "$STEPS" -lt $((3 * EVERY)) ] || [ "$STEPS" -gt 468 ]; then
  echo "mlp_sgemm.sh: STEPS must be 60 to 468 (three log windows, inside the first epoch)" >&2
  exit 64
fi
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT

printf '%-6s %14s %14s %14s %8s %10s\n' round "steady GF/s" "whole GF/s" "sgemm GF/s" steady "whole run"
for r in $(seq "$ROUNDS"); do
  rm -rf "$run/out"
  OPENBLAS_NUM_THREADS=$THREADS "$BUILD"/dtrain train configs/fashion-mnist-mlp.yaml \
    --set train.steps="$STEPS" --set runtime.threads="$THREADS" --set runtime.progress=off \
    --set output.dir="$run/out" --set train.log_every=$EVERY --set output.tensorboard=false >/dev/null
  m="$run/out/metrics.jsonl"
  whole=$(sed -n 's/.*"type":"summary".*"gflops":\([0-9.e+-]*\).*/\1/p' "$m")
  sps=$(sed -n 's/.*"type":"summary".*"samples_per_s":\([0-9.e+-]*\).*/\1/p' "$m")
  # GFLOP/s over the windows but the first and the last: samples / seconds
  # times the FLOPs a sample costs (the summary's GFLOP/s over its samples/s)
  steady=$(grep '"type":"train"' "$m" |
    sed 's/.*"step":\([0-9]*\).*"samples_per_s":\([0-9.e+-]*\).*"step_s":\([0-9.e+-]*\).*/\1 \2 \3/' |
    awk -v g="$whole" -v s="$sps" '{ st[NR] = $1; rate[NR] = $2; sec[NR] = $3 }
      END { for (i = 2; i < NR; i++) { n = st[i] - st[i - 1]; t += n * sec[i]; x += n * sec[i] * rate[i] }
            printf "%.2f", x / t * g / s }')
  sg=$("$BUILD"/bench/bench_sgemm 128 "$THREADS" 2 784 512 512 10 | awk '{print $2}')
  awk -v r="$r" -v a="$steady" -v w="$whole" -v b="$sg" \
    'BEGIN { printf "%-6s %14.2f %14.2f %14.2f %8.3f %10.3f\n", r, a, w, b, a / b, w / b }'
done | tee "$run/rounds"
# median and range of both ratios
for col in 5 6; do
  name=steady; [ $col = 6 ] && name="whole run"
  sort -n -k$col "$run/rounds" | awk -v c=$col -v name="$name" '{ v[++n] = $c }
    END { m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
          printf "dtrain / sgemm, %-9s: median %.3f, range %.3f to %.3f (%d rounds)\n", name, m, v[1], v[n], n }'
done
