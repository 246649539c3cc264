#!/usr/bin/env bash
# Data-parallel scaling on one machine: the quick-start MLP job (global
# batch 128, AdamW, fp32) on 1 rank x 1 thread and on N ranks x 1 thread,
# with dtrain under mpirun and with PyTorch DDP (gloo) on the same model,
# batch and process count, all in one run. Prints aggregate samples/s, the
# ratios, and dtrain's exposed communication time per step with overlap on
# and off.
# Then the machine's ceiling (dropout off, 128 samples per rank): N
# independent 1-rank runs started together, each pinned to its own core,
# against one N-rank run pinned one rank per core, with dtrain's ring
# all-reduce (the default) and with the MPI library's; the ratio to the
# ceiling is what data parallelism costs on top of the ranks' own work.
#   bash bench/scaling.sh [STEPS] [RANKS]
# Needs: build/ (launch/setup.sh), data/fashion-mnist.h5, python3-torch,
# taskset (util-linux) and at least RANKS cores.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-1500}
N=${2:-2}
BUILD=${BUILD_DIR:-build}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
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
weak() { # NAME ALLREDUCE
  dtrain_run "$1" "$N" --set model.dropout=0 --set train.global_batch=$((128 * N)) \
    --set comm.mpi_allreduce="$2"
  field "$1" summary samples_per_s
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
ceil=$(ceiling solo)
ring=$(weak weak_ring ring)
lib=$(weak weak_lib library)
ceil2=$(ceiling again)
printf '\nThe %s-core ceiling (dropout off, 128 samples per rank, 1 thread each)   samples/s\n' "$N"
printf '%-48s %10.0f\n' "$N independent 1-rank runs, pinned, together" "$ceil"
printf '%-48s %10.0f\n' "  (again, after the $N-rank runs)" "$ceil2"
printf '%-48s %10.0f\n' "dtrain $N ranks, ring all-reduce" "$ring"
printf '%-48s %10.0f\n' "dtrain $N ranks, the MPI library's all-reduce" "$lib"
awk -v a="$ring" -v b="$ceil" -v c="$ceil2" \
  'BEGIN { printf "%-48s %10.2f\n", "ring / ceiling (mean of both)", 2 * a / (b + c) }'
awk -v a="$lib" -v b="$ceil" -v c="$ceil2" \
  'BEGIN { printf "%-48s %10.2f\n", "library / ceiling (mean of both)", 2 * a / (b + c) }'
printf '\ndtrain per step (ms):           step  data  compute  comm exposed  optimizer\n'
for run in one many many_nooverlap weak_ring weak_lib; do
  case $run in
    one) label="1 rank" ;;
    many) label="$N ranks, overlap on" ;;
    many_nooverlap) label="$N ranks, overlap off" ;;
    weak_ring) label="$N x 128, ring" ;;
    *) label="$N x 128, library" ;;
  esac
  printf '  %-26s %7s %5s %8s %13s %10s\n' "$label" "$(mean_ms $run step_s)" \
    "$(mean_ms $run data_wait_s)" "$(mean_ms $run compute_s)" "$(mean_ms $run comm_exposed_s)" \
    "$(mean_ms $run optimizer_s)"
done
