#!/usr/bin/env bash
# Data-parallel scaling on one machine: the quick-start MLP job (global
# batch 128, AdamW, fp32) on 1 rank x 1 thread and on N ranks x 1 thread,
# with dtrain under mpirun and with PyTorch DDP (gloo) on the same model,
# batch and process count, all in one run. Prints aggregate samples/s, the
# ratios, and dtrain's exposed communication time per step with overlap on
# and off.
#   bash bench/scaling.sh [STEPS] [RANKS]
# Needs: build/ (launch/setup.sh), data/fashion-mnist.h5, python3-torch.
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
printf 'dtrain per step (ms):           step  data  compute  comm exposed  optimizer\n'
for run in one many many_nooverlap; do
  case $run in
    one) label="1 rank" ;;
    many) label="$N ranks, overlap on" ;;
    *) label="$N ranks, overlap off" ;;
  esac
  printf '  %-26s %7s %5s %8s %13s %10s\n' "$label" "$(mean_ms $run step_s)" \
    "$(mean_ms $run data_wait_s)" "$(mean_ms $run compute_s)" "$(mean_ms $run comm_exposed_s)" \
    "$(mean_ms $run optimizer_s)"
done
