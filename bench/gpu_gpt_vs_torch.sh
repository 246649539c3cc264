#!/usr/bin/env bash
# dtrain against PyTorch on one GPU for a GPT language model, measured in
# the same run: by default the GPT-2 small shape (12 layers, 12 heads,
# width 768, vocabulary 50257, context 1024) in bf16 (dtrain
# train.precision=bf16 against torch.autocast(bfloat16), fp32 master
# weights on both), AdamW, dropout 0, on BATCH sequences per step (default
# 8). PyTorch runs bench/gpu_gpt_vs_torch.py with
# F.scaled_dot_product_attention eagerly, and, when asked (COMPILE=1), once
# more with torch.compile (its --compile; minutes of compiling). Printed:
# tokens/s of each, dtrain's ratio to each, and the model-FLOPs utilisation
# of all three against PEAK_TFLOPS (default 989, the H100/H200 SXM dense
# bf16 datasheet figure), FLOPs per token counted the same way for all
# (gpu_gpt_vs_torch.py's formula: 6 x the matmul parameters plus 12 x
# layers x context x width), as a table and one `BENCH {json}` line.
#   bash bench/gpu_gpt_vs_torch.sh [BATCH]
# Environment: DTRAIN (default build-gpu/dtrain, else build/dtrain, else
# dtrain on PATH), PYTHON (default python3, with torch), LAYERS, HEADS,
# DIM, VOCAB, SEQ (the shape), TARGET_S (seconds of timed PyTorch steps,
# default 8), STEPS1/STEPS2 (dtrain's short and long run, default 4 and
# 14), COMPILE=1 (the torch.compile run too; NO_COMPILE=1 turns it off
# again), TORCH_TIMEOUT_S (each
# PyTorch run's limit, default 90 s: a torch.compile that takes longer is
# reported as unavailable, not as a failure), DTRAIN_BENCH_TMP (where the
# run folders go, default /dev/shm; the two runs of GPT-2 small take about
# 4 GB).
#
# The tokens are random ids in [0, VOCAB) written as a nanoGPT-style .bin
# and imported with `dtrain data import tokens` (throughput does not depend
# on their values). dtrain's tokens/s is the difference of a short and a
# long run, (tokens2 - tokens1) / (time2 - time1), from the summary record
# of metrics.jsonl, so start-up inside the training loop cancels as
# PyTorch's warm-up steps do. Needs a CUDA GPU; about three minutes on an
# H200.
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH=${1:-8}
PY=${PYTHON:-python3}
LAYERS=${LAYERS:-12} HEADS=${HEADS:-12} DIM=${DIM:-768} VOCAB=${VOCAB:-50257} SEQ=${SEQ:-1024}
PEAK=${PEAK_TFLOPS:-989}
TARGET_S=${TARGET_S:-8}
TORCH_TIMEOUT=${TORCH_TIMEOUT_S:-90}
S1=${STEPS1:-4} S2=${STEPS2:-14}
if [ -z "${DTRAIN:-}" ]; then
  for d in build-gpu/dtrain build/dtrain "$(command -v dtrain || true)"; do
    [ -n "$d" ] && [ -x "$d" ] && { DTRAIN=$d; break; }
  done
fi
[ -n "${DTRAIN:-}" ] || { echo "gpu_gpt_vs_torch: no dtrain (set DTRAIN)" >&2; exit 1; }
work=$(mktemp -d -p "${DTRAIN_BENCH_TMP:-/dev/shm}" 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- data: enough random tokens for the long run and an evaluation ------------------
ntok=$(((S2 + 2) * BATCH * (SEQ + 1) + SEQ + 2))
"$PY" - "$work/train.bin" "$ntok" "$VOCAB" <<'PYEOF'
import array, random, sys
rng = random.Random(1)
a = array.array("H", (rng.randrange(int(sys.argv[3])) for _ in range(int(sys.argv[2]))))
with open(sys.argv[1], "wb") as f:
    a.tofile(f)
PYEOF
"$DTRAIN" data import tokens --train "$work/train.bin" --val "$work/train.bin" \
  --vocab-size "$VOCAB" -o "$work/tokens.h5" >"$work/import.log" 2>&1 ||
  { cat "$work/import.log"; exit 1; }
rm -f "$work/train.bin"

summary() { grep '"type":"summary"' "$work/$1/metrics.jsonl" | sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p"; }
dtrain_run() { # DIR STEPS
  "$DTRAIN" train configs/gpt2-124m.yaml --set data.path="$work/tokens.h5" \
    --set output.dir="$work/$1" --resume never --set comm.backend=auto \
    --set model.n_layer="$LAYERS" --set model.n_head="$HEADS" --set model.n_embd="$DIM" \
    --set model.vocab_size=0 --set data.seq_len="$SEQ" --set train.global_batch="$BATCH" \
    --set train.micro_batch="$BATCH" --set train.eval_batch="$BATCH" --set train.steps="$2" \
    --set train.schedule.warmup_steps=0 --set train.log_every=1000000 \
    --set runtime.progress=off --set checkpoint.every_minutes=0 >"$work/$1.log" 2>&1
}

echo "dtrain: $("$DTRAIN" version | tr '\n' ' ')"
status=ok dt_tps=0
if dtrain_run a "$S1" && dtrain_run b "$S2"; then
  dt_tps=$(awk -v n1="$S1" -v n2="$S2" -v b="$BATCH" -v T="$SEQ" -v s1="$(summary a samples_per_s)" \
    -v s2="$(summary b samples_per_s)" \
    'BEGIN { t = n2 * b / s2 - n1 * b / s1; print (t > 0 ? (n2 - n1) * b * T / t : s2 * T) }')
  grep -h "done:" "$work/b.log" | sed 's/^/dtrain /' || true
else
  status=dtrain_failed
  echo "dtrain failed:"
  tail -8 "$work/a.log" "$work/b.log" 2>/dev/null || true
fi

# ---- PyTorch: eager SDPA, then torch.compile -------------------------------------------
torch_side() { # NAME EXTRA-ARGS...
  local name=$1
  shift
  timeout -k 5 "$TORCH_TIMEOUT" env LD_LIBRARY_PATH="${DTRAIN_HOST_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" \
    "$PY" bench/gpu_gpt_vs_torch.py --batch "$BATCH" --seq "$SEQ" --layers "$LAYERS" \
    --heads "$HEADS" --dim "$DIM" --vocab "$VOCAB" --precision bf16 --target-s "$TARGET_S" \
    --peak-tflops "$PEAK" "$@" >"$work/$name.json" 2>"$work/$name.err" || true
  sed -n 's/.*"tokens_per_s": *\([0-9.e+]*\).*/\1/p' "$work/$name.json" | tail -1
}
pt=$(torch_side eager)
[ -n "$pt" ] || { pt=0; echo "PyTorch (eager) failed:"; tail -5 "$work/eager.err"; }
ptc=0
if [ "${COMPILE:-0}" = 1 ] && [ "${NO_COMPILE:-0}" != 1 ]; then
  ptc=$(torch_side compiled --compile)
  [ -n "$ptc" ] || { ptc=0; echo "PyTorch (torch.compile) failed, is unavailable or took over ${TORCH_TIMEOUT}s:"; tail -3 "$work/compiled.err"; }
fi
fpt=$(sed -n 's/.*"flops_per_token": *\([0-9.e+]*\).*/\1/p' "$work/eager.json" | tail -1)
[ -n "$fpt" ] || fpt=$(awk -v L="$LAYERS" -v C="$DIM" -v V="$VOCAB" -v T="$SEQ" \
  'BEGIN { print 6 * (L * 12 * C * C + V * C) + 12 * L * T * C }')

awk -v d="$dt_tps" -v p="$pt" -v c="$ptc" -v f="$fpt" -v peak="$PEAK" -v b="$BATCH" -v T="$SEQ" \
  -v L="$LAYERS" -v C="$DIM" -v V="$VOCAB" -v status="$status" 'BEGIN {
    m = 1e12 * peak
    printf "\nGPT %dx%d, vocab %d, %d x %d tokens/step, bf16\n", L, C, V, b, T
    printf "%-28s %12s %8s %8s\n", "", "tokens/s", "MFU", "dtrain/x"
    printf "%-28s %12.0f %7.1f%% %8s\n", "dtrain", d, 100 * d * f / m, ""
    printf "%-28s %12.0f %7.1f%% %8.2f\n", "PyTorch SDPA (eager)", p, 100 * p * f / m, p > 0 ? d / p : 0
    if (c > 0)
      printf "%-28s %12.0f %7.1f%% %8.2f\n", "PyTorch SDPA + torch.compile", c, 100 * c * f / m, d / c
    printf "BENCH {\"model\":\"gpt\",\"layers\":%d,\"dim\":%d,\"vocab\":%d,\"seq\":%d,\"batch\":%d," \
      "\"precision\":\"bf16\",\"dtrain_tokens_per_s\":%.1f,\"torch_tokens_per_s\":%.1f," \
      "\"torch_compile_tokens_per_s\":%.1f,\"ratio\":%.4f,\"ratio_compile\":%.4f," \
      "\"flops_per_token\":%.0f,\"dtrain_mfu\":%.5f,\"torch_mfu\":%.5f,\"peak_tflops\":%s," \
      "\"status\":\"%s\"}\n", L, C, V, T, b, d, p, c, p > 0 ? d / p : 0, c > 0 ? d / c : 0, f,
      d * f / m, p * f / m, peak, status
  }'
[ "$status" = ok ] && [ "$pt" != 0 ]
