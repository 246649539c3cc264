#!/usr/bin/env bash
# The quick-start job on one GPU, held against the CPU backend it is built
# to match:
#   1. the default job (configs/fashion-mnist-mlp.yaml, 10 epochs) trained
#      with runtime.device=cuda reaches at least 88.5% test accuracy, like the
#      CPU run in tests/cli/accuracy_test.sh;
#   2. the same job for a few steps on cpu and on cuda (fp32, TF32 off,
#      dropout on, SGD with momentum and clipping so that a wrong gradient
#      scale shows, one metrics record per step) logs the same training
#      loss at every step, within a relative tolerance (DTRAIN_GPU_LOSS_RTOL,
#      default 1e-3), and ends with the same parameters: every tensor of
#      model.h5 within DTRAIN_GPU_PARAM_RTOL (default 1e-2) of its largest
#      value (same data order, same dropout masks, same initial parameters,
#      so only the GEMM summation order differs; the skipped steps below
#      make the run sensitive to it: on an AVX2 EPYC with OpenBLAS's Zen
#      kernels, the CPU run alone on 1 thread and on 2 threads cut into
#      columns, as the CPU cut its products before, ended 4.3e-3 apart in
#      fc2's bias, 2.4e-7 without the faults), with two micro-batches
#      per step, and the same test loss at the end (DTRAIN_GPU_LOSS_RTOL);
#      and at every step, the first included, the cuda run's
#      host waited for the device once (metrics' host_waits_per_step): for
#      the step's results (the gradient gate and the loss totals), with the
#      update already queued behind them (the first step too, since the
#      scratch is sized when the model is built);
#   3. a bf16 run of a few hundred steps keeps a finite loss that falls;
#   4. a small GPT (2 layers, attention, layer norm, embeddings, AdamW,
#      dropout) trained for a few steps on cpu and on cuda on the text of
#      tests/common/corpus.py logs the same loss at every step
#      and the same validation loss at the end
#      (DTRAIN_GPU_LOSS_RTOL) and ends with the same parameters, every
#      tensor within DTRAIN_GPU_GPT_RTOL (default 1e-3) of its largest value,
#      with one host wait per step as in 2;
#   5. the run of 2 in fp16: the same losses within DTRAIN_GPU_LOSS_RTOL and
#      parameters within DTRAIN_GPU_FP16_RTOL (default 5e-2: an activation
#      that rounds to the next fp16 value on one side only moves the rest),
#      the overflow counted as one (the loss scale halves) and the NaN as a
#      bad step on both, and one host wait per step.
# In 2 and 5 an overflow at step 6 and a NaN at step 13 (DTRAIN_FAULT) skip
# those steps on both backends, and both checkpoints' optimizer step counts
# are 2 short of the steps: on cuda the gate that unscales, clips and
# skips runs on the device, and the update queued behind it follows it.
# DTRAIN_GPU_TRAIN_PARTS picks the parts (default "1 2 3 4 5"; the host
# emulation build runs "2 4 5").
# Exits 77 (ctest: skipped) with "SKIPPED: why" when this dtrain has no
# usable GPU: `dtrain version` says so on its "gpu:" line (a binary without
# that line is probed with a one-step cuda run, which exits 64 and says why).
#   gpu_train.sh DTRAIN SOURCE_DIR [WORKDIR [COMPARE_MODELS]]
# COMPARE_MODELS is tests/mpi/compare_models of the same build (found next
# to DTRAIN's build or bundle when not given). DTRAIN_DATA overrides the
# dataset (default SOURCE_DIR/data/fashion-mnist.h5).
set -euo pipefail
DTRAIN=$1 SRC=$2
W=${3:-}
COMPARE=${4:-}
if [ -z "$COMPARE" ]; then
  for c in "$(dirname "$DTRAIN")/tests/mpi/compare_models" \
           "$(dirname "$DTRAIN")/../tests/compare_models"; do
    [ -x "$c" ] && COMPARE=$c && break
  done
fi
PRTOL=${DTRAIN_GPU_PARAM_RTOL:-1e-2}
DATA=${DTRAIN_DATA:-$SRC/data/fashion-mnist.h5}
JOB=$SRC/configs/fashion-mnist-mlp.yaml
RTOL=${DTRAIN_GPU_LOSS_RTOL:-1e-3}
GPT_RTOL=${DTRAIN_GPU_GPT_RTOL:-1e-3}
F16_RTOL=${DTRAIN_GPU_FP16_RTOL:-5e-2}
PARTS=" ${DTRAIN_GPU_TRAIN_PARTS:-1 2 3 4 5} "
CMP_STEPS=20
GPT_STEPS=10
BF16_STEPS=300
want() { [[ $PARTS == *" $1 "* ]]; }

if [ ! -f "$DATA" ]; then
  echo "SKIPPED: $DATA not imported (run launch/setup.sh)"
  exit 77
fi
if [ -z "$W" ]; then
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
fi
mkdir -p "$W"

run() { # NAME [--set ...]: one dtrain train into $W/NAME, output in $W/NAME.log
  local name=$1
  shift
  rm -rf "${W:?}/$name"
  if ! "$DTRAIN" train "${RUN_JOB:-$JOB}" --set data.path="${RUN_DATA:-$DATA}" \
    --set output.dir="$W/$name" --set runtime.progress=lines --resume never "$@" \
    >"$W/$name.log" 2>&1; then
    cat "$W/$name.log"
    echo "FAILED: dtrain train ($name) exited non-zero"
    return 1
  fi
}
record() { grep "\"type\":\"$2\"" "$W/$1/metrics.jsonl"; }
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p"; }
# "step loss" per training record (or per record of type $2)
losses() {
  record "$1" "${2:-train}" | while read -r l; do echo "$(field step <<<"$l") $(field loss <<<"$l")"; done
}

# ---- is there a GPU this dtrain can use? ---------------------------------------
version=$("$DTRAIN" version)
echo "$version"
if [[ $version != *cuda* ]]; then
  echo "SKIPPED: this dtrain was built without the cuda backend"
  exit 77
fi
gpu_line=$(grep '^gpu:' <<<"$version" || true)
if [ -n "$gpu_line" ]; then
  if [[ $gpu_line == "gpu: none"* ]]; then
    echo "SKIPPED: no usable GPU: ${gpu_line#gpu: none; }"
    exit 77
  fi
else
  set +e
  "$DTRAIN" train "$JOB" --set data.path="$DATA" --set output.dir="$W/probe" --resume never \
    --set runtime.device=cuda --set train.steps=1 --set train.schedule.warmup_steps=0 \
    --set runtime.progress=off >"$W/probe.log" 2>&1
  rc=$?
  set -e
  if [ "$rc" = 64 ] && grep -q 'cuda backend is not usable' "$W/probe.log"; then
    echo "SKIPPED: $(grep -o 'cuda backend is not usable.*' "$W/probe.log" | head -1)"
    exit 77
  fi
fi

same_losses() { # CPU_FILE CUDA_FILE STEPS: the per-step losses agree within RTOL
  paste "$1" "$2" | awk -v tol="$RTOL" -v want="$3" '
      function finite(v) { return v == v + 0 && v + 0 < 1e30 && v + 0 > -1e30 }
      function abs(v) { return v < 0 ? -v : v }
      BEGIN { printf "%5s %14s %14s %10s\n", "step", "cpu loss", "cuda loss", "rel diff" }
      {
        m = abs($2) > abs($4) ? abs($2) : abs($4); if (m < 1e-12) m = 1e-12
        d = abs($2 - $4) / m
        bad = $1 != $3 || !finite($2) || !finite($4) || d > tol
        printf "%5d %14.9g %14.9g %10.2e%s\n", $1, $2, $4, d, bad ? "  <-- over " tol : ""
        n++; nbad += bad; if (d > worst) worst = d
      }
      END {
        printf "%d steps compared, largest relative difference %.2e (tolerance %s)\n", n, worst, tol
        exit !(n == want && nbad == 0)
      }'
}

same_runs() { # CPU_RUN CUDA_RUN STEPS PARAM_RTOL: losses per step, then the final parameters
  local bad=0
  losses "$1" >"$W/$1.loss"
  losses "$2" >"$W/$2.loss"
  if ! same_losses "$W/$1.loss" "$W/$2.loss" "$3"; then
    echo "FAILED: $1 and $2 losses differ (or steps are missing)"
    bad=1
  fi
  # the evaluation at the end: its forwards follow each other without a
  # wait for the device, each batch uploaded while the last still computes
  losses "$1" eval >"$W/$1.eval"
  losses "$2" eval >"$W/$2.eval"
  if ! same_losses "$W/$1.eval" "$W/$2.eval" 1; then
    echo "FAILED: $1 and $2 test losses differ (or the evaluation is missing)"
    bad=1
  fi
  if [ -z "$COMPARE" ] || [ ! -x "$COMPARE" ]; then
    echo "FAILED: no compare_models program to compare the parameters with (pass it as the 4th argument)"
    bad=1
  elif ! "$COMPARE" "$W/$1/model.h5" "$W/$2/model.h5" "$4"; then
    echo "FAILED: $1 and $2 parameters differ by more than $4 after $3 steps"
    bad=1
  fi
  return "$bad"
}

one_wait() { # CUDA_RUN: one host wait for the device at every step
  record "$1" train | while read -r l; do
    echo "$(field step <<<"$l") $(field host_waits_per_step <<<"$l")"
  done | awk '
      { n++; if ($2 != 1) { printf "step %d: %s host waits\n", $1, $2; bad++ } }
      END { printf "%d records, %d with other than one host wait per step\n", n, bad + 0
            exit !(n >= 2 && bad == 0) }' || {
    echo "FAILED: $1 waited for the device other than once in a step (or logged no waits)"
    return 1
  }
}

FAULTS=0:overflow:5,0:nan:12 # DTRAIN_FAULT of parts 2 and 5 (0-based steps)
skipped() { # RUN OVERFLOWS BAD: the skipped steps of $FAULTS, and the optimizer's count
  local over t bad
  over=$(record "$1" train | field overflow_steps | awk '{ n += $1 } END { print n + 0 }')
  t=$("$DTRAIN" ckpt info "$W/$1/checkpoints/ckpt-$(printf %010d "$CMP_STEPS").h5" | sed -n 's/^  optim_t *//p')
  bad=$(grep -c 'not finite' "$W/$1.log" || true)
  echo "$1: $over overflow(s), $bad bad step(s), optimizer steps $t of $CMP_STEPS"
  if [ "$over" != "$2" ] || [ "$bad" != "$3" ] || [ "$t" != $((CMP_STEPS - 2)) ] ||
     ! grep -q "step 13: the loss .* not finite" "$W/$1.log"; then
    echo "FAILED: $1 did not skip exactly steps 6 and 13 ($2 overflow(s) and $3 bad step(s) expected)"
    return 1
  fi
}

fail=0
cuda=(--set runtime.device=cuda)

faulty_pair() { # NAME PARAM_RTOL OVERFLOWS BAD [--set ...]: parts 2 and 5, the run of
  # "${short[@]}" with $FAULTS on cpu and on cuda, held against each other
  local name=$1 tol=$2 over=$3 bad=$4 st=0
  shift 4
  DTRAIN_FAULT=$FAULTS run "${name}_cpu" "${short[@]}" "$@" --set runtime.device=cpu &&
    DTRAIN_FAULT=$FAULTS run "${name}_cuda" "${short[@]}" "$@" "${cuda[@]}" || return 1
  same_runs "${name}_cpu" "${name}_cuda" "$CMP_STEPS" "$tol" || st=1
  one_wait "${name}_cuda" || st=1
  skipped "${name}_cpu" "$over" "$bad" || st=1
  skipped "${name}_cuda" "$over" "$bad" || st=1
  return "$st"
}

# ---- 1. the default job on the GPU ------------------------------------------------
if want 1; then
echo "== 1. default job, 10 epochs, runtime.device=cuda"
if run full "${cuda[@]}"; then
  start=$(record full start || true)
  summary=$(record full summary || true)
  echo "start:   $start"
  echo "summary: $summary"
  device=$(field device <<<"$start")
  acc=$(field test_acc <<<"$summary")
  echo "device: $device; final test accuracy: $acc (required: 0.885)"
  if [ "$device" != cuda ]; then
    echo "FAILED: the run's start record names device '$device', not cuda"
    fail=1
  elif ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.885) }'; then
    echo "FAILED: test accuracy $acc < 0.885"
    fail=1
  fi
else
  fail=1
fi

fi

# ---- 2. cpu against cuda, step by step -----------------------------------------------
short=(--set train.steps="$CMP_STEPS" --set train.log_every=1 --set train.schedule.warmup_steps=5
       --set train.micro_batch=64
       --set train.precision=fp32 --set runtime.allow_tf32=false --set model.dropout=0.1
       --set checkpoint.every_minutes=0 --set train.optimizer.name=sgd
       --set train.optimizer.lr=0.05 --set train.optimizer.momentum=0.9 --set train.clip_norm=1.0)
if want 2; then
echo "== 2. $CMP_STEPS steps on cpu and on cuda (fp32, TF32 off, dropout 0.1, SGD, 2 micro-batches), loss per step and final parameters"
faulty_pair cmp "$PRTOL" 0 2 || fail=1

fi

# ---- 3. bf16 ---------------------------------------------------------------------------
if want 3; then
echo "== 3. $BF16_STEPS steps in bf16 on cuda"
if run bf16 "${cuda[@]}" --set train.precision=bf16 --set train.steps="$BF16_STEPS" \
  --set train.log_every=25 --set train.schedule.warmup_steps=50 --set checkpoint.every_minutes=0; then
  losses bf16 >"$W/bf16.loss"
  echo "precision: $(record bf16 start | field precision); test accuracy: $(record bf16 summary | field test_acc)"
  if ! awk -v want=$((BF16_STEPS / 25)) '
      function finite(v) { return v == v + 0 && v + 0 < 1e30 && v + 0 > -1e30 }
      { printf "step %5d loss %s\n", $1, $2; n++; if (!finite($2)) nonfinite++
        if (n == 1) first = $2; last = $2 }
      END {
        printf "first window %s, last window %s\n", first, last
        exit !(n == want && nonfinite == 0 && last < 0.7 * first)
      }' "$W/bf16.loss"; then
    echo "FAILED: bf16 loss not finite, not falling to below 0.7 x the first window, or records missing"
    fail=1
  fi
  [ "$(record bf16 start | field precision)" = bf16 ] || { echo "FAILED: the run was not bf16"; fail=1; }
else
  fail=1
fi

fi

# ---- 4. a small GPT, cpu against cuda ---------------------------------------------------
if want 4; then
echo "== 4. GPT (2 layers, n_embd 32), $GPT_STEPS steps on cpu and on cuda, loss per step and final parameters"
rm -rf "${W:?}/gpt" && mkdir -p "$W/gpt"
cat >"$W/gpt/gpt.yaml" <<'YEOF'
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, dropout: 0.1}
data: {path: text.h5, test_split: val, seq_len: 32}
train:
  global_batch: 16
  eval_batch: 64
  log_every: 1
  precision: fp32
  clip_norm: 1.0
  optimizer: {name: adamw, lr: 0.003, weight_decay: 0.1}
  schedule: {name: constant}
checkpoint: {every_minutes: 0}
runtime: {allow_tf32: false}
YEOF
if python3 "$SRC/tests/common/corpus.py" >"$W/gpt/corpus.txt" &&
   "$DTRAIN" data import text "$W/gpt/corpus.txt" -o "$W/gpt/text.h5" >"$W/gpt/import.log" 2>&1 &&
   RUN_JOB=$W/gpt/gpt.yaml RUN_DATA=$W/gpt/text.h5 run gpt_cpu --set train.steps=$GPT_STEPS --set runtime.device=cpu &&
   RUN_JOB=$W/gpt/gpt.yaml RUN_DATA=$W/gpt/text.h5 run gpt_cuda --set train.steps=$GPT_STEPS "${cuda[@]}"; then
  same_runs gpt_cpu gpt_cuda "$GPT_STEPS" "$GPT_RTOL" || fail=1
  one_wait gpt_cuda || fail=1
else
  cat "$W/gpt/import.log"
  fail=1
fi
fi

# ---- 5. fp16 with skipped steps, cpu against cuda ----------------------------------------
if want 5; then
echo "== 5. the run of 2 in fp16 on cpu and on cuda"
faulty_pair f16 "$F16_RTOL" 1 1 --set train.precision=fp16 || fail=1
fi

if [ "$fail" = 0 ]; then echo "gpu_train: all passed"; else echo "gpu_train: FAILED"; fi
exit "$fail"
