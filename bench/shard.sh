#!/usr/bin/env bash
# comm.shard: per-rank memory and speed of a GPT whose model state
# dominates memory (8 layers x 512 wide, 25.3 M parameters, AdamW, fp32,
# byte-level vocabulary, sequences of 128, gradient buckets of 4 MiB),
# replicated (comm.shard: none), with the optimizer state sharded
# (optimizer), with the gradients sharded too (gradients) and with the
# parameters too (parameters), on 1, 2 and 4 ranks, all in one run:
#   - each rank's peak host memory (the largest rank's, getrusage) and the
#     model state the start record gives per rank, against the formula:
#     replicated 16 bytes a parameter (parameters, gradients, AdamW's two
#     moments), optimizer 8 + 8/N, gradients 4 + 12/N (plus the gradient
#     staging area, about three buckets), parameters 16/N (plus the
#     staging area and the parameter gather slots, about three buckets
#     each);
#   - on 4 ranks, replicated and parameters again with less beside the
#     state (model.recompute all, 1 MiB buckets), and their peaks' ratio;
#   - tokens/s on 2 ranks, each stage against replicated, ROUNDS (default
#     3) rounds in rotating order, each ratio and their median; then the
#     same with accumulation (two micro-batches a rank);
#   - the peer, where PyTorch is installed: the same GPT under PyTorch's
#     DistributedDataParallel (gloo) with AdamW replicated and with
#     ZeroRedundancyOptimizer (its optimizer state sharded), and with
#     PyTorch 2 its FullyShardedDataParallel on the CPU (SHARD_GRAD_OP,
#     FULL_SHARD), on 2 and 4 processes: the largest rank's peak resident
#     size and tokens/s (bench/torch_zero.py). PEER_PY names the Python to
#     run it with (default Debian's /usr/bin/python3, whose PyTorch 1.13
#     has no working FSDP under Python 3.11); for FSDP:
#       python3 -m venv peer && peer/bin/pip install torch==2.5.1 h5py
#       PEER_PY=peer/bin/python bash bench/shard.sh
# The peak includes the end-of-training checkpoint's host staging, which a
# run holds beside its state: the parameters and every rank's optimizer
# state (replicated, the whole state; sharded, its shard).
#   [ROUNDS=3] [PEER_PY=python] bash bench/shard.sh [STEPS]
# Needs: build/ (launch/setup.sh), python3, at least 2 cores; for the peer
# python3-torch and python3-h5py (Debian's), or PEER_PY.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}
ROUNDS=${ROUNDS:-3}
BUILD=${BUILD_DIR:-build}
. bench/blas_env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 tests/common/corpus.py 400000 >"$work/corpus.txt"
"$BUILD"/dtrain data import text "$work/corpus.txt" --val-fraction 0.005 -o "$work/text.h5" >/dev/null
cat >"$work/gpt.yaml" <<YEOF
model: {type: gpt, n_layer: 8, n_head: 8, n_embd: 512, dropout: 0}
data: {path: $work/text.h5, test_split: val, seq_len: 128, workers: 1}
train:
  steps: $STEPS
  global_batch: 8
  eval_batch: 8
  log_every: $STEPS
  optimizer: {name: adamw, lr: 0.0003, weight_decay: 0.1}
  schedule: {name: constant}
checkpoint: {every_minutes: 0}
comm: {bucket_mb: 4}
runtime: {threads: 1, progress: off}
YEOF

run() { # NAME NP SHARD [args...]
  local name=$1 np=$2 shard=$3
  shift 3
  bash tests/mpi/mpirun.sh "$np" "$BUILD"/dtrain train "$work/gpt.yaml" --set output.dir="$work/$name" \
    --set comm.shard="$shard" "$@" >"$work/$name.out" 2>&1 ||
    { echo "shard.sh: run $name failed:" >&2; tail -5 "$work/$name.out" >&2; exit 1; }
}
field() { grep "\"type\":\"$2\"" "$work/$1/metrics.jsonl" | sed -n "s/.*\"$3\":\([0-9.e+-]*\).*/\1/p"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

echo "== per-rank memory (MiB), $STEPS steps each"
printf "%-6s %-10s %12s %12s %14s %12s\n" ranks shard "peak host" "model state" "formula state" tokens/s
for np in 1 2 4; do
  for shard in none optimizer gradients parameters; do
    [ "$np" = 1 ] && [ "$shard" != none ] && continue
    name="m$np$shard"
    run "$name" "$np" "$shard"
    params=$(field "$name" start params)
    state=$(field "$name" start model_state_bytes)
    formula=$(awk -v p="$params" -v n="$np" -v s="$shard" \
      'BEGIN { printf "%.0f", (s == "none" ? 16 * p : s == "optimizer" ? (8 + 8 / n) * p : s == "gradients" ? (4 + 12 / n) * p : 16 / n * p) / 1048576 }')
    printf "%-6s %-10s %12s %12s %14s %12s\n" "$np" "$shard" "$(mib "$(field "$name" summary peak_host_mem_bytes)")" \
      "$(mib "$state")" "$formula" "$(field "$name" train tokens_per_s)"
  done
done
base=$(field m4none summary peak_host_mem_bytes)
for shard in optimizer gradients parameters; do
  echo "4 ranks: $shard peak / replicated peak = $(awk -v a="$(field "m4$shard" summary peak_host_mem_bytes)" \
    -v b="$base" 'BEGIN { printf "%.3f", a / b }')"
done
# the same 4 ranks with less beside the model state (model.recompute all:
# a quarter of the activations; 1 MiB buckets: smaller gradient staging
# and parameter gather slots), replicated and with the parameters sharded
lean=(--set model.recompute=all --set comm.bucket_mb=1)
run m4leannone 4 none "${lean[@]}"
run m4leanparameters 4 parameters "${lean[@]}"
echo "4 ranks, model.recompute all and 1 MiB buckets: peak $(mib "$(field m4leannone summary peak_host_mem_bytes)") MiB" \
  "replicated, $(mib "$(field m4leanparameters summary peak_host_mem_bytes)") MiB parameters, ratio" \
  "$(awk -v a="$(field m4leanparameters summary peak_host_mem_bytes)" -v b="$(field m4leannone summary peak_host_mem_bytes)" \
    'BEGIN { printf "%.3f", a / b }')"

# rounds PREFIX [args...]: tokens/s on 2 ranks of each stage against
# replicated, ROUNDS rounds in rotating order, each ratio and the medians
orders=("none optimizer gradients parameters" "optimizer gradients parameters none"
        "gradients parameters none optimizer" "parameters none optimizer gradients")
rounds() {
  local pre=$1 k shard r line
  shift
  : >"$work/ratios"
  for ((k = 0; k < ROUNDS; k++)); do
    for shard in ${orders[$((k % 4))]}; do run "$pre$k$shard" 2 "$shard" "$@"; done
    line="round $((k + 1)):"
    for shard in none optimizer gradients parameters; do line+=" $shard $(field "$pre$k$shard" train tokens_per_s)"; done
    for shard in optimizer gradients parameters; do
      r=$(awk -v a="$(field "$pre$k$shard" train tokens_per_s)" -v b="$(field "$pre${k}none" train tokens_per_s)" \
        'BEGIN { printf "%.3f", a / b }')
      line+=", $shard/none $r"
      echo "$shard $r" >>"$work/ratios"
    done
    echo "$line tokens/s"
  done
  for shard in optimizer gradients parameters; do
    grep "^$shard " "$work/ratios" | cut -d' ' -f2 | sort -g |
      awk -v s="$shard" '{ v[NR] = $1 } END { printf "%s: median ratio %.3f (min %.3f, max %.3f)\n", s, v[int((NR + 1) / 2)], v[1], v[NR] }'
  done
}
echo "== tokens/s on 2 ranks, each stage / replicated, $ROUNDS rounds in rotating order"
rounds t
echo "== the same with accumulation (train.micro_batch 2: two micro-batches a rank, each reduced when sharding gradients)"
rounds a --set train.micro_batch=2

PY=${PEER_PY:-/usr/bin/python3}
if "$PY" -c 'import torch, h5py; from torch.distributed.optim import ZeroRedundancyOptimizer' \
  2>/dev/null; then
  hows="ddp zero"
  "$PY" -c 'import torch; assert int(torch.__version__.split(".")[0]) >= 2
from torch.distributed.fsdp import FullyShardedDataParallel' 2>/dev/null && hows+=" fsdp_grad fsdp_full"
  echo "== PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), gloo, the same GPT, $STEPS steps"
  printf "%-6s %-34s %12s %12s\n" ranks "how" "peak RSS" tokens/s
  for np in 2 4; do
    for how in $hows; do
      out=$(cd bench && "$PY" torch_zero.py "$work/text.h5" "$STEPS" "$np" 8 128 8 8 512 "$how" 2>"$work/peer.err") ||
        { echo "shard.sh: the peer ($how, $np processes) failed:" >&2; tail -5 "$work/peer.err" >&2; exit 1; }
      case $how in
        ddp) what="DDP, AdamW replicated" ;;
        zero) what="DDP, ZeroRedundancyOptimizer" ;;
        fsdp_grad) what="FSDP SHARD_GRAD_OP" ;;
        fsdp_full) what="FSDP FULL_SHARD" ;;
      esac
      printf "%-6s %-34s %12s %12s\n" "$np" "$what" \
        "$(sed -n 's/torch_peak_rss_mib //p' <<<"$out")" "$(sed -n 's/torch_tokens_per_s //p' <<<"$out")"
    done
  done
else
  echo "== PyTorch with ZeroRedundancyOptimizer and h5py not found ($PY): no peer figures"
fi
