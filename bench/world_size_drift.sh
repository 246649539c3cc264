#!/usr/bin/env bash
# How far the parameters of one job trained on 1 rank and on N ranks drift
# apart with the length of the run. Both see the same samples in every
# step; only the order of the float sums differs (how the global batch is
# split over ranks and micro-batches), and training amplifies that. For
# each length it prints the largest parameter difference relative to its
# tensor's largest value (tests/mpi/compare_models), and the test loss and
# accuracy of both runs.
#   bash bench/world_size_drift.sh [RANKS] [STEPS...]
# Defaults: 2 ranks; 5, 20, 468 (one epoch) and 4680 (the quick-start
# job's 10 epochs) steps. Needs build/ (launch/setup.sh) and
# data/fashion-mnist.h5.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
shift || true
LENGTHS=("$@")
[ ${#LENGTHS[@]} -gt 0 ] || LENGTHS=(5 20 468 4680)
BUILD=${BUILD_DIR:-build}
COMPARE=$BUILD/tests/mpi/compare_models
[ -x "$COMPARE" ] || { echo "world_size_drift: $COMPARE is missing (build the tests)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() { # NAME NP STEPS
  bash tests/mpi/mpirun.sh "$2" "$BUILD"/dtrain train configs/fashion-mnist-mlp.yaml \
    --set train.steps="$3" --set train.schedule.warmup_steps=0 --set runtime.threads=1 \
    --set runtime.progress=off --set output.dir="$work/$1" >/dev/null
}
field() { grep '"type":"summary"' "$work/$1/metrics.jsonl" | sed "s/.*\"$2\":\([0-9.e-]*\).*/\1/"; }

printf "%8s  %-22s  %-24s  %-24s\n" steps "largest rel. diff" "1 rank: loss / acc" "$N ranks: loss / acc"
for steps in "${LENGTHS[@]}"; do
  run "one$steps" 1 "$steps"
  run "many$steps" "$N" "$steps"
  worst=$("$COMPARE" "$work/one$steps/model.h5" "$work/many$steps/model.h5" 1e30 | sed -n 's/^worst \([^ ]*\).*/\1/p')
  printf "%8s  %-22s  %-24s  %-24s\n" "$steps" "$worst" \
    "$(field "one$steps" test_loss) / $(field "one$steps" test_acc)" \
    "$(field "many$steps" test_loss) / $(field "many$steps" test_acc)"
done
