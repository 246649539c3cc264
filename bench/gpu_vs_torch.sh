#!/usr/bin/env bash
# dtrain against PyTorch on one GPU, measured in the same run: the
# quick-start MLP (784-512-512-10) and a wide one (784-4096-4096-4096-10),
# both with dropout 0.1 and AdamW, at global batch 128 and 4096, in fp32
# (TF32 allowed on both sides) and bf16 (dtrain train.precision=bf16 against
# torch.autocast(bfloat16); fp32 master weights on both). For each
# configuration it prints samples/s of both, their ratio, and the
# model-FLOPs utilisation (MFU) of both against the GPU's dense bf16 peak
# (PEAK_TFLOPS, default 989: the H200/H100 SXM datasheet figure; the fp32
# rows are held against the same bf16 peak), as a table and as one
# machine-readable `BENCH {json}` line per configuration.
#   bash bench/gpu_vs_torch.sh [PEAK_TFLOPS]
# Environment: DTRAIN (default build-gpu/dtrain, else build/dtrain, else
# dtrain on PATH), DTRAIN_DATA (default data/fashion-mnist.h5), PYTHON
# (default python3, the one with torch and h5py), TARGET_S (seconds of timed
# training per run and side, default 1.5), DATA_WORKERS (dtrain loader
# threads, default 4), DTRAIN_BENCH_TMP (where the run folders go, default
# /dev/shm; about 1.2 GB at most).
#
# dtrain's samples/s come from the summary record of metrics.jsonl (training
# time, evaluation excluded). Each configuration runs twice, a short run and
# a longer one sized from it, and the figure is the difference, (samples2 -
# samples1) / (time2 - time1), so start-up costs inside the training loop
# (first cuBLAS calls, filling the loader) cancel, as PyTorch's warm-up steps
# do; where timing noise makes that difference meaningless the longer run's
# own figure is taken. FLOPs per sample are those of the forward and
# backward matmuls, counted as dtrain's summary counts them, the same for
# both sides. PyTorch runs without the dtrain GPU bundle's libraries on its
# library path (DTRAIN_HOST_LD_LIBRARY_PATH, set by the bundle's env).
# Relative paths in DTRAIN and DTRAIN_DATA are taken from the repository root.
# Needs a CUDA GPU; takes about two minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PEAK=${1:-${PEAK_TFLOPS:-989}}
DATA=${DTRAIN_DATA:-data/fashion-mnist.h5}
PY=${PYTHON:-python3}
TARGET_S=${TARGET_S:-1.5}
WORKERS=${DATA_WORKERS:-4}
if [ -z "${DTRAIN:-}" ]; then
  for d in build-gpu/dtrain build/dtrain "$(command -v dtrain || true)"; do
    [ -n "$d" ] && [ -x "$d" ] && { DTRAIN=$d; break; }
  done
fi
[ -n "${DTRAIN:-}" ] || { echo "gpu_vs_torch: no dtrain (set DTRAIN)" >&2; exit 1; }
[ -f "$DATA" ] || { echo "gpu_vs_torch: $DATA is missing (launch/setup.sh, or set DTRAIN_DATA)" >&2; exit 1; }
# Run folders in memory where possible: every run ends with a checkpoint
# and model.h5 (about 0.6 GB for the wide model), deleted once read.
work=$(mktemp -d -p "${DTRAIN_BENCH_TMP:-/dev/shm}" 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT

# name hidden batch precision first-run-steps
CONFIGS="784-512-512-10         512,512        128  fp32 300
784-512-512-10         512,512        128  bf16 300
784-512-512-10         512,512        4096 fp32 30
784-512-512-10         512,512        4096 bf16 30
784-4096-4096-4096-10  4096,4096,4096 128  fp32 200
784-4096-4096-4096-10  4096,4096,4096 128  bf16 200
784-4096-4096-4096-10  4096,4096,4096 4096 fp32 30
784-4096-4096-4096-10  4096,4096,4096 4096 bf16 30"
MAX_STEPS=20000

# Training FLOPs per sample, counted as dtrain counts them: 2*in*out per
# matmul, three matmuls per layer (forward, weight and input gradients) but
# two for the first (no input gradient).
flops_per_sample() {
  awk -v h="784,$1,10" 'BEGIN { n = split(h, d, ","); for (i = 1; i < n; i++) f += 2 * d[i] * d[i + 1] * (i == 1 ? 2 : 3); print f }'
}
summary() { grep '"type":"summary"' "$work/$1/metrics.jsonl" | sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p"; }
dtrain_run() { # DIR HIDDEN BATCH PRECISION STEPS
  "$DTRAIN" train configs/fashion-mnist-mlp.yaml --set data.path="$DATA" --set output.dir="$work/$1" \
    --resume never --set runtime.device=cuda --set runtime.allow_tf32=true \
    --set train.precision="$4" --set model.hidden="[$2]" --set model.dropout=0.1 \
    --set train.global_batch="$3" --set train.steps="$5" --set train.schedule.warmup_steps=0 \
    --set train.log_every=1000000 --set runtime.progress=off --set checkpoint.every_minutes=0 \
    --set data.workers="$WORKERS" >"$work/$1.log" 2>&1
}

echo "dtrain: $("$DTRAIN" version | tr '\n' ' ')"
echo "peak for MFU: $PEAK TFLOP/s dense bf16 (H200 SXM datasheet by default; PEAK_TFLOPS or \$1 to change)"

# ---- PyTorch: every configuration in one process ----------------------------------
torch_args=()
while read -r _ hidden batch prec _; do torch_args+=("$hidden:$batch:$prec"); done <<<"$CONFIGS"
if env LD_LIBRARY_PATH="${DTRAIN_HOST_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" TARGET_S="$TARGET_S" \
  "$PY" bench/torch_gpu_mlp.py "$DATA" "${torch_args[@]}" >"$work/torch.txt" 2>&1; then
  torch_ok=1
else
  torch_ok=0
  echo "PyTorch side failed:"
  cat "$work/torch.txt"
fi
grep '^torch_info' "$work/torch.txt" || true

# ---- dtrain, and the table ------------------------------------------------------------
printf '\n%-22s %5s %4s | %12s %12s %6s | %9s %8s %8s\n' model batch prec "dtrain s/s" "torch s/s" \
  ratio "dt TFLOP/s" "dt MFU" "pt MFU"
fail=0
i=0
while read -r name hidden batch prec n1; do
  i=$((i + 1))
  status=ok dt_sps=0
  if dtrain_run "a$i" "$hidden" "$batch" "$prec" "$n1"; then
    sps1=$(summary "a$i" samples_per_s)
    n2=$(awk -v s="$sps1" -v b="$batch" -v t="$TARGET_S" -v n="$n1" -v m="$MAX_STEPS" \
      'BEGIN { k = int(t * s / b); if (k < n) k = n; if (k > m) k = m; print n + k }')
    if dtrain_run "b$i" "$hidden" "$batch" "$prec" "$n2"; then
      sps2=$(summary "b$i" samples_per_s)
      dt_sps=$(awk -v n1="$n1" -v n2="$n2" -v b="$batch" -v s1="$sps1" -v s2="$sps2" \
        'BEGIN { t = n2 * b / s2 - n1 * b / s1; print (t > 0 ? (n2 - n1) * b / t : s2) }')
    else
      status=dtrain_failed
    fi
  else
    status=dtrain_failed
  fi
  rm -rf "$work/a$i/checkpoints" "$work/b$i/checkpoints" "$work/a$i/model.h5" "$work/b$i/model.h5"
  if [ "$status" != ok ]; then
    echo "dtrain failed for $name batch $batch $prec:"
    tail -5 "$work/a$i.log" "$work/b$i.log" 2>/dev/null || true
    fail=1
  fi
  pt_sps=$(awk -v h="hidden=$hidden" -v b="batch=$batch" -v p="precision=$prec" \
    '$1 == "torch" && $2 == h && $3 == b && $4 == p {
       for (i = 5; i <= NF; i++) if (sub("^samples_per_s=", "", $i)) print $i }' \
    "$work/torch.txt")
  [ -n "$pt_sps" ] || { pt_sps=0; [ "$status" = ok ] && status=torch_failed; fail=1; }
  awk -v name="$name" -v hidden="$hidden" -v batch="$batch" -v prec="$prec" -v d="$dt_sps" \
    -v p="$pt_sps" -v fps="$(flops_per_sample "$hidden")" -v peak="$PEAK" -v status="$status" \
    -v out="$work/bench.jsonl" 'BEGIN {
      ratio = p > 0 ? d / p : 0
      tf = d * fps / 1e12; mfu = tf / peak; pmfu = p * fps / 1e12 / peak
      printf "%-22s %5d %4s | %12.0f %12.0f %6.2f | %9.2f %7.2f%% %7.2f%%%s\n", name, batch, prec, d, p,
        ratio, tf, 100 * mfu, 100 * pmfu, status == "ok" ? "" : "  " status
      printf "BENCH {\"model\":\"%s\",\"hidden\":[%s],\"batch\":%d,\"precision\":\"%s\",\"tf32\":true," \
        "\"dtrain_samples_per_s\":%.1f,\"torch_samples_per_s\":%.1f,\"ratio\":%.4f," \
        "\"flops_per_sample\":%.0f,\"dtrain_tflops\":%.3f,\"dtrain_mfu\":%.5f,\"torch_mfu\":%.5f," \
        "\"peak_tflops\":%s,\"status\":\"%s\"}\n", name, hidden, batch, prec, d, p, ratio, fps, tf,
        mfu, pmfu, peak, status >>out
    }'
done <<<"$CONFIGS"
echo
cat "$work/bench.jsonl"
[ "$torch_ok" = 1 ] || fail=1
exit "$fail"
