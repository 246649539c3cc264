#!/usr/bin/env bash
# train.reproducible against the default mode: training samples/s of the
# quick-start job (configs/fashion-mnist-mlp.yaml, 784-512-512-10, batch
# 128) on 1 rank and on 2 ranks, 1 thread per rank, shards of SHARD rows
# (default 32: the same bits on 1, 2 and 4 ranks), ROUNDS rounds
# (default 3) that alternate the two modes, each round's ratio
# (reproducible / default) and their median and spread; then the same for
# configs/fashion-mnist-cnn.yaml (JOBS names others). BASE=micro makes the
# baseline the default mode with micro-batches of SHARD rows (the shapes the
# reproducible mode computes with), so the ratio is the cost of the sum
# tree alone.
#   [ROUNDS=3] [SHARD=32] [BASE=micro] [JOBS="a.yaml b.yaml"] bash bench/repro.sh [STEPS]
# Needs build/ (launch/setup.sh), data/fashion-mnist.h5, 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-400}
ROUNDS=${ROUNDS:-3}
SHARD=${SHARD:-32}
BUILD=${BUILD_DIR:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sps() { # JOB NP MODE -> samples/s of the training steps
  local job=$1 np=$2 mode=$3 extra=()
  [ "$mode" = repro ] && extra=(--set train.reproducible=true --set train.shard_rows="$SHARD")
  [ "$mode" = default ] && [ "${BASE:-}" = micro ] && extra=(--set train.micro_batch="$SHARD")
  rm -rf "$work/run"
  bash tests/mpi/mpirun.sh "$np" "$BUILD"/dtrain train "$job" --set train.steps="$STEPS" \
    --set train.schedule.warmup_steps=10 --set runtime.threads=1 --set runtime.progress=off \
    --set output.dir="$work/run" "${extra[@]}" > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
  grep '"type":"summary"' "$work/run/metrics.jsonl" | sed 's/.*"samples_per_s":\([0-9.e+]*\).*/\1/'
}

for job in ${JOBS:-configs/fashion-mnist-mlp.yaml configs/fashion-mnist-cnn.yaml}; do
  for np in 1 2; do
    ratios=()
    for ((i = 1; i <= ROUNDS; i++)); do
      if ((i % 2)); then d=$(sps "$job" "$np" default); p=$(sps "$job" "$np" repro)
      else p=$(sps "$job" "$np" repro); d=$(sps "$job" "$np" default); fi
      ratio=$(awk -v p="$p" -v d="$d" 'BEGIN { printf "%.3f", p / d }')
      ratios+=("$ratio")
      printf "%-34s %d rank(s) round %d: default %8.0f  reproducible %8.0f samples/s  ratio %s\n" \
        "$job" "$np" "$i" "$d" "$p" "$ratio"
    done
    printf "%s\n" "${ratios[@]}" | sort -n | awk -v j="$job" -v n="$np" \
      '{ r[NR] = $1 } END { printf "%-34s %d rank(s): median ratio %.3f (range %.3f to %.3f)\n", j, n, r[int((NR + 1) / 2)], r[1], r[NR] }'
  done
done
