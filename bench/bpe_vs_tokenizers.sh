#!/usr/bin/env bash
# GPT-2 byte-level BPE encoding speed: dtrain's io/bpe.c (tests/hf/bpe_tool,
# one thread) against Hugging Face tokenizers (one encode call on the
# whole text, which tokenizers runs on one thread; RAYON_NUM_THREADS=1 and
# TOKENIZERS_PARALLELISM=false as well) on the same text: this
# repository's docs and C sources (each file once, about 1.5 MB), with a
# byte-level BPE of 8000 tokens trained on it by tokenizers. Each side
# loads a fresh tokenizer per round (its word cache empty) and the time is
# the encoding alone. ROUNDS rounds (default 5), alternating the order;
# tokens/s of both, each round's ratio (dtrain / tokenizers) and their
# median and range. The token ids must be the same (checked every round).
#   [ROUNDS=5] [BUILD_DIR=build] [PY=build/hf-venv/bin/python] bash bench/bpe_vs_tokenizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
BUILD=${BUILD_DIR:-build}
PY=${PY:-$BUILD/hf-venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat docs/*.md README.md */*.c */*/*.c */*/*/*.c 2> /dev/null > "$work/text.txt"
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
"$PY" - "$work" <<'PY'
import sys
from tokenizers import ByteLevelBPETokenizer
w = sys.argv[1]
t = ByteLevelBPETokenizer()
t.train([w + "/text.txt"], vocab_size=8000, min_frequency=2, special_tokens=["<|endoftext|>"],
        show_progress=False)
t.save_model(w)
PY
hf() {
  "$PY" - "$work" <<'PY'
import sys, time
import numpy as np
from tokenizers import ByteLevelBPETokenizer
w = sys.argv[1]
text = open(w + "/text.txt", encoding="utf-8").read()
t = ByteLevelBPETokenizer(w + "/vocab.json", w + "/merges.txt")
t.add_special_tokens(["<|endoftext|>"])
t0 = time.perf_counter()
ids = t.encode(text).ids
s = time.perf_counter() - t0
np.array(ids, dtype=np.int32).tofile(w + "/hf.bin")
print(f"{len(ids) / s:.0f}")
PY
}
ours() {
  "$BUILD"/tests/hf/bpe_tool "$work" "$work/text.txt" 1 "$work/dt.bin" | sed 's/.*tokens_per_s //'
}
echo "text: $(wc -c < "$work/text.txt") bytes"
ratios=()
for ((i = 1; i <= ROUNDS; i++)); do
  if ((i % 2)); then h=$(hf); d=$(ours); else d=$(ours); h=$(hf); fi
  cmp -s "$work/hf.bin" "$work/dt.bin" || { echo "round $i: the token ids differ"; exit 1; }
  r=$(awk -v d="$d" -v h="$h" 'BEGIN { printf "%.2f", d / h }')
  ratios+=("$r")
  printf "round %d: tokenizers %10.0f  dtrain %10.0f tokens/s  ratio %s\n" "$i" "$h" "$d" "$r"
done
printf "%s\n" "${ratios[@]}" | sort -n | awk \
  '{ r[NR] = $1 } END { printf "median ratio %.2f (range %.2f to %.2f)\n", r[int((NR + 1) / 2)], r[1], r[NR] }'
