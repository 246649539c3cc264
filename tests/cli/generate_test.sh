#!/usr/bin/env bash
# `dtrain generate` end to end, on a tiny GPT trained a few steps on the
# bytes of a text file:
#   - stdout is the prompt and then exactly --tokens bytes (nothing else:
#     messages go to stderr); an empty prompt starts from a newline that is
#     not printed;
#   - one seed gives the same text twice (and on 1 or 2 threads, and from
#     the run's model.h5 as from its final checkpoint), another seed another
#     text;
#     temperature 0 (greedy) gives one text whatever the seed, and top-k 1
#     gives that same text at any temperature;
#   - with the key/value cache (the default) the text is the one a full
#     forward of the window per token (--no-cache) gives, sampled and
#     greedy, past the window (it slides) and from a prompt longer than it;
#   - a dataset whose tokenizer is gpt2 (no tokenizer files) is refused
#     (64), as are a model
#     without the causal mask (64), bad options (64), a missing checkpoint
#     (66) and several ranks under mpirun;
#   - dtrain eval reports perplexity for a language model.
# The datasets come from the importers: the text as byte tokens, and the
# same bytes as a "gpt2" token file (valid data that dtrain trains on but
# cannot decode, which is what the refusal needs).
#   generate_test.sh DTRAIN TEXT_FILE WORKDIR
set -uo pipefail
DTRAIN=$1
TEXT=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
source "$HERE/lib.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
"$DTRAIN" data import text "$TEXT" -o byte.h5 >/dev/null || { echo "cannot write byte.h5"; exit 1; }
"$PY" -c 'import array, sys
array.array("H", list(open(sys.argv[1], "rb").read())).tofile(open(sys.argv[2], "wb"))' "$TEXT" bytes.bin &&
  "$DTRAIN" data import tokens --train bytes.bin --val bytes.bin -o gpt2.h5 >/dev/null ||
  { echo "cannot write gpt2.h5"; exit 1; }
cat > job.yaml <<'YEOF'
model:
  type: gpt
  n_layer: 1
  n_head: 2
  n_embd: 32
data:
  path: byte.h5
  test_split: val
  seq_len: 32
train:
  steps: 30
  global_batch: 8
  log_every: 10
  optimizer:
    name: adamw
    lr: 0.003
runtime:
  progress: off
output:
  dir: run
YEOF
"$DTRAIN" train job.yaml > train.log 2>&1 || { cat train.log; echo "training failed"; exit 1; }
CKPT=$(ls run/checkpoints/ckpt-*.h5 | tail -n 1)
[ -f "$CKPT" ] || { echo "no checkpoint after training"; exit 1; }

gen() { "$DTRAIN" generate job.yaml --checkpoint "$CKPT" "$@" 2> gen.err; }
PROMPT="The model "

# stdout: the prompt, then exactly --tokens bytes
gen --prompt "$PROMPT" --tokens 40 --seed 1 > s1a.txt || bad "generate failed: $(cat gen.err)"
size=$(wc -c < s1a.txt)
[ "$size" = $((${#PROMPT} + 40)) ] && ok || bad "40 tokens after a ${#PROMPT}-byte prompt gave $size bytes"
[ "$(head -c ${#PROMPT} s1a.txt)" = "$PROMPT" ] && ok || bad "the output does not start with the prompt"
grep -q '\[dtrain' s1a.txt && bad "log lines on stdout: $(cat s1a.txt)" || ok
gen --prompt "$PROMPT" --tokens 7 > t7.txt && [ "$(wc -c < t7.txt)" = $((${#PROMPT} + 7)) ] && ok ||
  bad "--tokens 7 gave $(wc -c < t7.txt) bytes"
gen --prompt "$PROMPT" --tokens 0 > t0.txt && [ "$(cat t0.txt)" = "$PROMPT" ] && ok ||
  bad "--tokens 0 printed more than the prompt: $(cat t0.txt)"
gen --prompt '' --tokens 12 > empty.txt && [ "$(wc -c < empty.txt)" = 12 ] && ok ||
  bad "an empty prompt and 12 tokens gave $(wc -c < empty.txt) bytes: $(cat gen.err)"

# the same seed, the same text; another seed, another text
gen --prompt "$PROMPT" --tokens 40 --seed 1 > s1b.txt
cmp -s s1a.txt s1b.txt && ok || bad "seed 1 twice gave different texts"
gen --prompt "$PROMPT" --tokens 40 --seed 2 > s2.txt
cmp -s s1a.txt s2.txt && bad "seeds 1 and 2 gave the same text: $(cat s1a.txt)" || ok
gen --prompt "$PROMPT" --tokens 40 --seed 1 --temperature 0.8 --top-k 0 > s1c.txt
cmp -s s1a.txt s1c.txt && ok || bad "the defaults (temperature 0.8, top-k 0) written out changed the text"
# the draws do not depend on the thread count (nor do these probabilities)
gen --prompt "$PROMPT" --tokens 40 --seed 1 --set runtime.threads=1 > s1t1.txt
gen --prompt "$PROMPT" --tokens 40 --seed 1 --set runtime.threads=2 > s1t2.txt
cmp -s s1t1.txt s1t2.txt && ok || bad "seed 1 on 1 and 2 threads gave different texts"

# the run's model.h5 holds the final checkpoint's parameters: the same text
gen --prompt "$PROMPT" --tokens 40 --seed 1 --checkpoint run/model.h5 > model.txt ||
  bad "generate from model.h5 failed: $(cat gen.err)"
cmp -s s1a.txt model.txt && ok || bad "model.h5 and the final checkpoint gave different texts"
expect 65 "model file run/model.h5 has tensor wte.weight of shape 256x32, where the job's model has 256x16" \
  -- "$DTRAIN" generate job.yaml --checkpoint run/model.h5 --prompt x --set model.n_embd=16

# greedy: one text whatever the seed; top-k 1 is greedy at any temperature
gen --prompt "$PROMPT" --tokens 30 --temperature 0 --seed 1 > g1.txt
gen --prompt "$PROMPT" --tokens 30 --temperature 0 --seed 99 > g2.txt
cmp -s g1.txt g2.txt && ok || bad "greedy generation depends on the seed"
gen --prompt "$PROMPT" --tokens 30 --temperature 1.5 --top-k 1 --seed 5 > k1.txt
cmp -s g1.txt k1.txt && ok || bad "top-k 1 differs from greedy: $(cat g1.txt) / $(cat k1.txt)"
# a temperature far below 1 (even one that underflows a double's normal
# range) is a value, and as good as greedy; the largest top-k keeps all
gen --prompt "$PROMPT" --tokens 30 --temperature 1e-320 --seed 5 > tiny.txt ||
  bad "--temperature 1e-320 refused: $(cat gen.err)"
cmp -s g1.txt tiny.txt && ok || bad "temperature 1e-320 differs from greedy: $(cat tiny.txt)"
gen --prompt "$PROMPT" --tokens 40 --seed 1 --top-k 9223372036854775807 > kmax.txt
cmp -s s1a.txt kmax.txt && ok || bad "top-k 2^63-1 differs from top-k 0: $(cat gen.err)"

# the key/value cache against a full forward per token: the window is 32
# tokens, so 100 new tokens slide it; a 60-byte prompt starts beyond it
DTRAIN_LOG=info gen --prompt "$PROMPT" --tokens 100 --seed 3 > c1.txt
grep -q "key/value cache" gen.err && ok || bad "the default did not use the cache: $(grep generate gen.err)"
DTRAIN_LOG=info gen --prompt "$PROMPT" --tokens 100 --seed 3 --no-cache > c2.txt
grep -q "a full forward per token" gen.err && ok || bad "--no-cache used the cache: $(grep generate gen.err)"
cmp -s c1.txt c2.txt && ok || bad "sampled: the cache and the full forward wrote different texts"
gen --prompt "$PROMPT" --tokens 100 --temperature 0 > c3.txt
gen --prompt "$PROMPT" --tokens 100 --temperature 0 --no-cache > c4.txt
cmp -s c3.txt c4.txt && ok || bad "greedy: the cache and the full forward wrote different texts"
LONG="The model of this test reads more bytes of prompt than its window"
gen --prompt "$LONG" --tokens 50 --seed 4 > c5.txt
gen --prompt "$LONG" --tokens 50 --seed 4 --no-cache > c6.txt
cmp -s c5.txt c6.txt && [ "$(wc -c < c5.txt)" = $((${#LONG} + 50)) ] && ok ||
  bad "a prompt longer than the window: different texts or lengths"

# refusals
expect 64 "tokenizer 'gpt2' and keeps no copy of its files" -- "$DTRAIN" generate job.yaml \
  --checkpoint "$CKPT" --prompt x --set data.path=gpt2.h5
cat > noncausal.yaml <<'YEOF'
model:
  type: layers
  layers:
    - {name: wte, kind: embedding, dim: 16}
    - {name: wpe, kind: pos_embedding}
    - {name: qkv, kind: linear, out: 48}
    - {name: attn, kind: attention, heads: 2, causal: false}
    - {name: head, kind: linear, out: classes}
data:
  path: byte.h5
  test_split: val
  seq_len: 32
YEOF
expect 64 "layer 'attn' is attention with causal: false" -- "$DTRAIN" generate noncausal.yaml \
  --checkpoint "$CKPT" --prompt x
expect 66 "nothere.h5" -- "$DTRAIN" generate job.yaml --checkpoint run/nothere.h5 --prompt x
expect 64 "--checkpoint PATH is required" -- "$DTRAIN" generate job.yaml --prompt x
expect 64 "--prompt TEXT is required" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT"
expect 64 "--tokens needs a whole number" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --tokens -1
expect 64 "--tokens needs a whole number" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --tokens 5x
expect 64 "--temperature needs a number" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --temperature -0.5
expect 64 "--temperature needs a number" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --temperature nan
expect 64 "--top-k needs a whole number" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --top-k many
expect 64 "--seed needs a whole number" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --seed -3
expect 64 "^dtrain: generate: --tokens needs a whole number from 0 to 1000000000 \(the most one run generates\), not '10000000000'$" \
  -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" --prompt x --tokens 10000000000
# a number past 64 bits is out of the range, not "not a number"; a blank
# before a sign does not wrap a seed around to 2^64-1
expect 64 "^dtrain: generate: --tokens needs a whole number from 0 to 1000000000 .*, not '99999999999999999999'$" \
  -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" --prompt x --tokens 99999999999999999999
expect 64 "^dtrain: generate: --seed needs a whole number from 0 to 18446744073709551615, not '18446744073709551616'$" \
  -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" --prompt x --seed 18446744073709551616
expect 64 "^dtrain: generate: --seed needs a whole number from 0 to 18446744073709551615, not ' -1'$" \
  -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" --prompt x --seed " -1"
expect 64 "^dtrain: generate: --temperature needs a number of at least 0 \(0: always the most likely token\), not '1e999'$" \
  -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" --prompt x --temperature 1e999
expect 64 "--seed needs a value" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --seed
expect 64 "unknown option '--frobnicate'" -- "$DTRAIN" generate job.yaml --checkpoint "$CKPT" \
  --prompt x --frobnicate
expect 64 "no job file" -- "$DTRAIN" generate --checkpoint "$CKPT" --prompt x
expect 64 "runs on one rank.*2 ranks" -- $MPIRUN 2 "$DTRAIN" generate job.yaml \
  --checkpoint "$CKPT" --prompt x

# eval of a language model: loss and perplexity
expect 0 "test loss [0-9.]+, perplexity [0-9.]+, next-token accuracy" -- "$DTRAIN" eval job.yaml \
  --checkpoint "$CKPT"
expect 0 "generate JOB.yaml --checkpoint PATH --prompt TEXT" -- "$DTRAIN" --help
expect 0 "usage: dtrain generate JOB.yaml" -- "$DTRAIN" generate --help

echo "generate: $pass passed, $fail failed"
[ "$fail" = 0 ]
