#!/usr/bin/env bash
# Checkpoints written before parameters were aligned in the flat buffers
# still resume. The fixture tests/fixtures/ckpt-v2-mlp8.h5 (step 3 of a
# 784-8-10 MLP with AdamW) was written when the tensors lay back to back;
# today each starts on 256 bytes, with zero padding between them. A
# checkpoint holds each tensor by name, so the layout must not matter:
#   - resumed at its own last step, the run's model.h5 holds the very
#     parameters of that run's model file (model-v1-mlp8.h5), bit for bit;
#   - resumed for 5 more steps (AdamW, so the saved moments matter; the
#     gradients clipped, so the gradient norm matters), on 1 and 2 ranks,
#     the parameters are those the unaligned dtrain reached from the same
#     checkpoint (model-v1-mlp8-step8.h5; bit-identical on the machine that
#     made it, to 1e-5 relative elsewhere, where BLAS kernels round
#     otherwise);
#   - the parameter count in the log and metrics.jsonl is the tensors'
#     (6370), not the padded buffer's.
#   legacy_resume_test.sh DTRAIN COMPARE_MODELS SOURCE_DIR WORKDIR
set -uo pipefail
DTRAIN=$1 COMPARE=$2 SRC=$3 W=$4
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
FIX="$SRC/tests/fixtures"
DATA="$SRC/data/fashion-mnist.h5"
if [ ! -f "$DATA" ]; then
  echo "SKIP: $DATA not imported (run launch/setup.sh)"
  exit 77
fi
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
source "$HERE/lib.sh"

# the fixture's job, as it was run (tests/fixtures/README.md)
job=(train "$SRC/configs/fashion-mnist-mlp.yaml" --set data.path="$DATA" --set model.hidden=[8]
     --set train.schedule.warmup_steps=0 --set runtime.progress=lines)
# the continuation that made model-v1-mlp8-step8.h5
more=(--set train.steps=8 --set train.schedule.name=constant --set train.clip_norm=0.05
      --resume "$FIX/ckpt-v2-mlp8.h5")

expect 0 "resumed from .*ckpt-v2-mlp8.h5: step 3" -- \
  "$DTRAIN" "${job[@]}" --set train.steps=3 --set output.dir="$W/at3" \
  --resume "$FIX/ckpt-v2-mlp8.h5"
if "$COMPARE" "$FIX/model-v1-mlp8.h5" "$W/at3/model.h5" 0; then ok; else
  bad "the parameters resumed from the unaligned checkpoint differ from that run's model file"
fi

expect 0 "mlp: 6370 parameters in 4 tensors" -- \
  "$DTRAIN" "${job[@]}" "${more[@]}" --set output.dir="$W/np1"
if "$COMPARE" "$FIX/model-v1-mlp8-step8.h5" "$W/np1/model.h5" 1e-5; then ok; else
  bad "5 steps from the unaligned checkpoint on 1 rank end elsewhere than the unaligned dtrain"
fi
if grep -q '"type":"start".*"params":6370,' "$W/np1/metrics.jsonl"; then ok; else
  bad "metrics.jsonl's start record does not count 6370 parameters: $(grep start "$W/np1/metrics.jsonl")"
fi

expect 0 "resumed from .*ckpt-v2-mlp8.h5: step 3" -- \
  $MPIRUN 2 "$DTRAIN" "${job[@]}" "${more[@]}" --set output.dir="$W/np2"
if "$COMPARE" "$FIX/model-v1-mlp8-step8.h5" "$W/np2/model.h5" 1e-5; then ok; else
  bad "5 steps from the unaligned checkpoint on 2 ranks end elsewhere than the unaligned dtrain"
fi

echo "legacy_resume: $pass passed, $fail failed"
[ "$fail" = 0 ]
