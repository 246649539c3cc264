#!/usr/bin/env bash
# Data-parallel scaling on one machine: the quick-start MLP job (global
# batch 128, AdamW, fp32) on 1 rank x 1 thread and on N ranks x 1 thread,
# with dtrain under mpirun and with PyTorch DDP (gloo) on the same model,
# batch and process count, all in one run. Prints aggregate samples/s, the
# ratios, and dtrain's exposed communication time per step with overlap on
# and off.
# Then the machine's ceiling (dropout off, 128 samples per rank): N
# independent 1-rank runs started together, each pinned to its own core,
# against one N-rank run pinned one rank per core: with dtrain's ring
# all-reduce and the sharded update (the defaults), the ring with every
# rank updating everything, and the MPI library's all-reduce. The ratio to
# the ceiling is what data parallelism costs on top of the ranks' own work;
# ROUNDS (default 3) alternating rounds, and their median.
#   [ROUNDS=3] bash bench/scaling.sh [STEPS] [RANKS]
# Needs: build/ (launch/setup.sh), data/fashion-mnist.h5, python3-torch,
# taskset (util-linux) and at least RANKS cores.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-1500}
N=${2:-2}
BUILD=${BUILD_DIR:-build}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
. bench/blas_env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

dtrain_run() { # NAME NP [--set ...]; one rank per core
  local name=$1 np=$2
  shift 2
  DTRAIN_MPI_BIND=core bash tests/mpi/mpirun.sh "$np" "$BUILD"/dtrain train configs/fashion-mnist-mlp.yaml \
    --set train.steps="$STEPS" --set runtime.threads=1 --set runtime.progress=off \
    --set data.workers=1 --set train.log_every=100 --set output.dir="$work/$name" "$@" >/dev/null
}
field() { grep "\"type\":\"$2\"" "$work/$1/metrics.jsonl" | sed "s/.*\"$3\":\([0-9.e-]*\).*/\1/"; }
# mean of a per-step field over the logged windows, in milliseconds
mean_ms() { field "$1" train "$2" | awk '{ s += $1; n++ } END { printf "%.3f", 1000 * s / n }'; }

# The ceiling: the same per-rank work with nothing shared.
ceiling_run() { # NAME CORE
  taskset -c "$2" "$BUILD"/dtrain train configs/fashion-mnist-mlp.yaml \
    --set train.steps="$STEPS" --set runtime.threads=1 --set runtime.progress=off \
    --set data.workers=1 --set train.log_every=100 --set model.dropout=0 \
    --set train.global_batch=128 --set output.dir="$work/$1" >/dev/null
}
ceiling() { # NAME
  local pids=() k
  for ((k = 0; k < N; k++)); do
    ceiling_run "$1$k" "$k" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k"; done
  for ((k = 0; k < N; k++)); do field "$1$k" summary samples_per_s; done |
    awk '{ s += $1 } END { printf "%.1f", s }'
}
weak() { # NAME ALLREDUCE [--set ...]
  local name=$1 how=$2
  shift 2
  dtrain_run "$name" "$N" --set model.dropout=0 --set train.global_batch=$((128 * N)) \
    --set comm.mpi_allreduce="$how" "$@"
  field "$name" summary samples_per_s
}

dtrain_run one 1
dtrain_run many "$N"
dtrain_run many_nooverlap "$N" --set comm.overlap=false
OMP_NUM_THREADS=1 "$PY" bench/torch_ddp.py /usr/share/datasets/fashion-mnist "$STEPS" 1 1 128 \
  > "$work/ddp1.txt"
OMP_NUM_THREADS=1 "$PY" bench/torch_ddp.py /usr/share/datasets/fashion-mnist "$STEPS" "$N" 1 128 \
  > "$work/ddpn.txt"

d1=$(field one summary samples_per_s)
dn=$(field many summary samples_per_s)
t1=$(awk '/ddp_samples_per_s/ {print $2}' "$work/ddp1.txt")
tn=$(awk '/ddp_samples_per_s/ {print $2}' "$work/ddpn.txt")
printf 'MLP 784-512-512-10, global batch 128, %s steps   samples/s\n' "$STEPS"
printf '%-40s %10.0f\n' "dtrain 1 rank x 1 thread" "$d1"
printf '%-40s %10.0f\n' "dtrain $N ranks x 1 thread" "$dn"
awk -v a="$dn" -v b="$d1" -v n="$N" 'BEGIN { printf "%-40s %10.2f\n", "dtrain scaling (" n " ranks / 1)", a / b }'
printf '%-40s %10.0f\n' "PyTorch DDP gloo 1 process" "$t1"
printf '%-40s %10.0f\n' "PyTorch DDP gloo $N processes" "$tn"
awk -v a="$tn" -v b="$t1" -v n="$N" 'BEGIN { printf "%-40s %10.2f\n", "DDP scaling (" n " / 1)", a / b }'
awk -v a="$dn" -v b="$tn" 'BEGIN { printf "%-40s %10.2f\n", "dtrain / DDP at the same process count", a / b }'
# The ceiling and the N-rank runs alternate, ROUNDS times, so that a change
# in the machine's speed during the benchmark (a shared host) falls on both
# sides of each ratio; the median ratio is the result.
ROUNDS=${ROUNDS:-3}
printf '\nThe %s-core ceiling (dropout off, 128 samples per rank, 1 thread each), samples/s\n' "$N"
printf '%-6s %12s %12s %8s %12s %8s %14s %8s\n' round ceiling sharded ratio "ring, full" ratio \
  "library" ratio
for ((i = 1; i <= ROUNDS; i++)); do
  ceil=$(ceiling "solo$i.")
  shard=$(weak "shard$i" ring)
  full=$(weak "full$i" ring --set comm.shard=none)
  lib=$(weak "lib$i" library)
  awk -v i="$i" -v c="$ceil" -v s="$shard" -v f="$full" -v l="$lib" 'BEGIN {
    printf "%-6s %12.0f %12.0f %8.3f %12.0f %8.3f %14.0f %8.3f\n", i, c, s, s / c, f, f / c, l, l / c }'
done | tee "$work/rounds.txt"
med() { awk -v c="$1" '{ print $c }' "$work/rounds.txt" | sort -g | sed -n "$(((ROUNDS + 1) / 2))p"; }
printf '%-6s %12s %12s %8.3f %12s %8.3f %14s %8.3f\n' median "" "" "$(med 4)" "" "$(med 6)" "" "$(med 8)"
printf '\ndtrain per step (ms):           step  data  compute  comm exposed  optimizer\n'
for run in one many many_nooverlap shard1 full1 lib1; do
  case $run in
    one) label="1 rank" ;;
    many) label="$N ranks, overlap on" ;;
    many_nooverlap) label="$N ranks, overlap off" ;;
    shard1) label="$N x 128, ring, sharded" ;;
    full1) label="$N x 128, ring, full update" ;;
    *) label="$N x 128, library" ;;
  esac
  printf '  %-26s %7s %5s %8s %13s %10s\n' "$label" "$(mean_ms $run step_s)" \
    "$(mean_ms $run data_wait_s)" "$(mean_ms $run compute_s)" "$(mean_ms $run comm_exposed_s)" \
    "$(mean_ms $run optimizer_s)"
done
