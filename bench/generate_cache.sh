#!/usr/bin/env bash
# Generation with the key/value cache against a full forward of the window
# per token (--no-cache): tokens/s of `dtrain generate` for the tiny GPT of
# configs/text-gpt-tiny.yaml (4 blocks of 4 heads, width 128) at a window
# (data.seq_len) of 128 and of 512 tokens, on byte tokens of this
# repository's docs. Each run continues a prompt of WINDOW - 64 bytes by 64
# tokens, so the context grows from WINDOW - 64 to WINDOW tokens and the
# window never slides; the time counts the prompt's pass. ROUNDS rounds
# (default 3) alternate the two; each round's ratio (cache / no cache) and
# their median and range. The parameters come from 2 training steps (the
# speed does not depend on their values). Both runs of a round must print
# the same text (greedy draws): the script stops otherwise.
#   [ROUNDS=3] [BUILD_DIR=build] [THREADS=1] bash bench/generate_cache.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
BUILD=${BUILD_DIR:-build}
THREADS=${THREADS:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat docs/*.md > "$work/text.txt"
"$BUILD"/dtrain data import text "$work/text.txt" -o "$work/text.h5" > /dev/null
prompt_of() { head -c "$1" docs/training.md | tr -d '\0'; }

for window in 128 512; do
  set_args=(--set data.path="$work/text.h5" --set data.seq_len="$window"
    --set runtime.threads="$THREADS" --set runtime.progress=off)
  rm -rf "$work/run"
  "$BUILD"/dtrain train configs/text-gpt-tiny.yaml "${set_args[@]}" --set train.steps=2 \
    --set train.global_batch=2 --set train.eval_batch=2 --set train.schedule.warmup_steps=1 \
    --set output.dir="$work/run" \
    > "$work/train.out" 2>&1 || { cat "$work/train.out"; exit 1; }
  prompt=$(prompt_of $((window - 64)))
  tps() { # MODE -> tokens/s; the text in $work/MODE.txt
    local mode=$1 extra=()
    [ "$mode" = nocache ] && extra=(--no-cache)
    DTRAIN_LOG=info "$BUILD"/dtrain generate configs/text-gpt-tiny.yaml "${set_args[@]}" \
      --checkpoint "$work/run/model.h5" --prompt "$prompt" --tokens 64 --temperature 0 \
      "${extra[@]}" > "$work/$mode.txt" 2> "$work/$mode.err" || { cat "$work/$mode.err"; exit 1; }
    sed -n 's/.*tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p' "$work/$mode.err"
  }
  ratios=()
  for ((i = 1; i <= ROUNDS; i++)); do
    if ((i % 2)); then n=$(tps nocache); c=$(tps cache)
    else c=$(tps cache); n=$(tps nocache); fi
    cmp -s "$work/cache.txt" "$work/nocache.txt" ||
      { echo "window $window: the cache and the full forward wrote different texts"; exit 1; }
    ratio=$(awk -v c="$c" -v n="$n" 'BEGIN { printf "%.2f", c / n }')
    ratios+=("$ratio")
    printf "window %3d round %d: no cache %8.1f  cache %8.1f tokens/s  ratio %s\n" \
      "$window" "$i" "$n" "$c" "$ratio"
  done
  printf "%s\n" "${ratios[@]}" | sort -n | awk -v w="$window" \
    '{ r[NR] = $1 } END { printf "window %3d: median ratio %.2f (range %.2f to %.2f)\n", w, r[int((NR + 1) / 2)], r[1], r[NR] }'
done
