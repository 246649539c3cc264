#!/usr/bin/env bash
# dtrain against PyTorch on a tiny GPT's training step on the CPU: the same
# model, token windows, batch and AdamW (weight decay on 2-D weights,
# embeddings included), fp32, dropout 0, one rank and the same thread count,
# measured in the same run; tokens/s of both and their ratio.
#   bash bench/gpt_vs_torch.sh [JOB] [STEPS] [THREADS]
# JOB defaults to configs/text-gpt-tiny.yaml where it and its dataset exist;
# without them, the job is n_layer 4, n_head 4, n_embd 128, seq_len 128,
# batch 16 on the UTF-8 bytes of this repository's C sources (vocabulary
# 256, byte tokens), written here.
# Both figures leave out the first 5 steps (dtrain's first logged window)
# and the evaluation; STEPS must be at least 10.
# Needs: build/ (launch/setup.sh; BUILD_DIR to use another), python3-torch
# and python3-h5py (/usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."
JOB=${1:-configs/text-gpt-tiny.yaml}
STEPS=${2:-50}
THREADS=${3:-1}
BUILD=${BUILD_DIR:-build}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
. bench/blas_env.sh
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT

DEFAULT=configs/text-gpt-tiny.yaml
builtin=0
if [ ! -f "$JOB" ]; then
  [ "$JOB" = "$DEFAULT" ] || { echo "gpt_vs_torch: no job file $JOB" >&2; exit 66; }
  builtin=1
elif [ "$JOB" = "$DEFAULT" ]; then
  "$BUILD"/dtrain train "$JOB" --print-config > "$run/default.yaml"
  data=$(awk 'index($0, "  path:") == 1 { sub("  path: *", ""); print; exit }' "$run/default.yaml")
  if [ ! -f "$data" ]; then
    echo "gpt_vs_torch: $data (of $JOB) is missing (its header says how to make it);" \
         "using the built-in job instead" >&2
    builtin=1
  fi
fi
if [ "$builtin" = 1 ]; then
  # A byte-level token file: the C sources; val is a few windows (the
  # trainer evaluates it at the end, outside the figure but not the wall time).
  find runtime kernels io collectives -name '*.c' | sort | xargs cat > "$run/text.txt"
  "$PY" - "$run/text.txt" "$run/tokens.h5" <<'PYEOF'
import sys
import h5py
import numpy as np
data = np.frombuffer(open(sys.argv[1], "rb").read(), dtype=np.uint8).astype(np.uint16)
cut = len(data) - 4 * 129
with h5py.File(sys.argv[2], "w") as f:
    f.attrs.update(dtrain_format="dataset", format_version=1, task="language_model",
                   vocab_size=256, tokenizer="byte")
    f["train/tokens"], f["val/tokens"] = data[:cut], data[cut:]
PYEOF
  cat > "$run/gpt-tiny.yaml" <<YAML
model: {type: gpt, n_layer: 4, n_head: 4, n_embd: 128, dropout: 0}
data: {path: $run/tokens.h5, test_split: val, seq_len: 128}
train:
  global_batch: 16
  optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1}
YAML
  JOB=$run/gpt-tiny.yaml
fi

# The model as the job resolves it.
"$BUILD"/dtrain train "$JOB" --print-config > "$run/job.yaml"
key() { awk -v k="  $1:" 'index($0, k) == 1 { sub(k " *", ""); print; exit }' "$run/job.yaml"; }
opt() { awk -v k="    $1:" 'index($0, k) == 1 { sub(k " *", ""); print; exit }' "$run/job.yaml"; }
[ "$(key type)" = gpt ] || { echo "gpt_vs_torch: $JOB is not a model.type gpt job" >&2; exit 64; }
[ "$(opt name)" = adamw ] || { echo "gpt_vs_torch: $JOB does not use adamw" >&2; exit 64; }
awk -v d="$(key dropout)" 'BEGIN { exit !(d + 0 == 0) }' ||
  { echo "gpt_vs_torch: $JOB has dropout; this comparison is for dropout 0" >&2; exit 64; }
[ "$STEPS" -ge 10 ] ||
  { echo "gpt_vs_torch: STEPS must be at least 10 (5 are warm-up)" >&2; exit 64; }
batch=$(key global_batch)
seq=$(key seq_len)

OPENBLAS_NUM_THREADS=$THREADS "$BUILD"/dtrain train "$JOB" \
  --set train.steps="$STEPS" --set train.schedule.warmup_steps=0 \
  --set runtime.threads="$THREADS" --set runtime.progress=off \
  --set output.dir="$run/dt" --set train.log_every=5 --set output.tensorboard=false >/dev/null
# Steps after the first logged window of 5 (PyTorch's side leaves out 5
# warm-up steps too): their tokens over their time.
dt_tps=$(grep '"type":"train"' "$run/dt/metrics.jsonl" |
  sed 's/.*"step":\([0-9]*\).*"step_s":\([0-9.e+-]*\).*/\1 \2/' |
  awk -v bt="$((batch * seq))" 'NR > 1 { n = $1 - prev; tok += n * bt; t += n * $2 } { prev = $1 }
    END { if (t > 0) print tok / t; else print "nan" }')
# GFLOP/s at that rate: the summary's GFLOP per sample (its gflops over its samples/s).
summary=$(grep '"type":"summary"' "$run/dt/metrics.jsonl")
dt_gf=$(echo "$summary" | sed 's/.*"gflops":\([0-9.]*\).*"samples_per_s":\([0-9.]*\).*/\1 \2/;
  s/.*"samples_per_s":\([0-9.]*\).*"gflops":\([0-9.]*\).*/\2 \1/' |
  awk -v tps="$dt_tps" -v t="$seq" '{ print $1 / $2 * tps / t }')

OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS \
  "$PY" bench/torch_gpt.py "$(key path)" "$STEPS" "$THREADS" "$batch" "$seq" "$(key n_layer)" \
  "$(key n_head)" "$(key n_embd)" "$(key vocab_size)" "$(key tie_embeddings)" "$(opt lr)" \
  "$(opt weight_decay)" "$(key clip_norm)" > "$run/torch.txt"
th_tps=$(awk '/torch_tokens_per_s/ {print $2}' "$run/torch.txt")

printf '%-40s %12s\n' "GPT L$(key n_layer) H$(key n_head) C$(key n_embd) T$seq, b=$batch" "tokens/s"
printf '%-40s %12.0f\n' "dtrain ($THREADS thread)" "$dt_tps"
printf '%-40s %12.0f\n' "PyTorch ($THREADS thread)" "$th_tps"
awk -v a="$dt_tps" -v b="$th_tps" 'BEGIN { printf "%-40s %12.2f\n", "ratio dtrain/PyTorch", a / b }'
printf '%-40s %12.2f\n' "dtrain achieved GFLOP/s" "$dt_gf"
