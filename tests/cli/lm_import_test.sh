#!/usr/bin/env bash
# dtrain data import text and tokens, end to end: text files as byte
# tokens (the train/val cut inside and across files), nanoGPT raw uint16
# and llm.c token files (GPT-2 and Llama 3 headers, more than one chunk of
# the importer), the attributes and every token read back with h5dump;
# then every bad input with its exit code, a message naming the file, and
# no output or temporary file left behind; --force.
#   lm_import_test.sh DTRAIN WORKDIR
set -uo pipefail
DTRAIN=$1
W=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$W" && mkdir -p "$W/d"
cd "$W"
source "$HERE/lib.sh"
# nothing by the output's name or its temporary name
no_output() {
  local left
  left=$(ls -d "$1" "$1".tmp.* 2>/dev/null) # what exists (ls fails when any is missing)
  if [ -n "$left" ]; then bad "output $1 left behind: $left"; else ok; fi
}
# attr FILE NAME VALUE: a root attribute as h5dump prints it
attr() {
  local v
  v=$(h5dump -a "/$2" "$1" 2>&1 | sed -n 's/^ *(0): //p')
  [ "$v" = "$3" ] && ok || bad "$1: attribute $2 is '$v', expected '$3'"
}
# dtype FILE SPLIT TYPE: the HDF5 type of /SPLIT/tokens
dtype() {
  local t
  t=$(h5dump -H -d "/$2/tokens" "$1" 2>&1 | sed -n 's/^ *DATATYPE *//p')
  [ "$t" = "$3" ] && ok || bad "$1: /$2/tokens is '$t', expected '$3'"
}
# tokens FILE SPLIT EXPECTED: /SPLIT/tokens holds exactly EXPECTED's bytes
tokens() {
  rm -f got.bin
  if ! h5dump -b LE -d "/$2/tokens" -o got.bin "$1" >/dev/null 2>&1; then
    bad "$1: cannot read /$2/tokens"; return
  fi
  cmp -s got.bin "$3" && ok || bad "$1: /$2/tokens differs from $3 ($(wc -c < got.bin) bytes, expected $(wc -c < "$3"))"
}
# splits FILE NAMES: the groups at the root, sorted, space-separated
splits() {
  local g
  g=$(h5dump -n "$1" 2>&1 | sed -n 's/^ *group *\/\([^/][^/]*\)$/\1/p' | sort | tr '\n' ' ')
  [ "$g" = "$2 " ] && ok || bad "$1: splits '$g', expected '$2'"
}
# text_expect OUT FRACTION FILES...: the uint16 tokens of the train and val
# parts of the files' bytes, cut as the importer documents it
text_expect() {
  local out=$1 f=$2; shift 2
  python3 - "$out" "$f" "$@" <<'PY'
import math, struct, sys
out, f, files = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
data = b"".join(open(p, "rb").read() for p in files)
cut = math.floor(len(data) * (1.0 - f))
for name, part in (("train", data[:cut]), ("val", data[cut:])):
    open(f"{out}.{name}", "wb").write(struct.pack(f"<{len(part)}H", *part))
PY
}

python3 "$HERE/make_lm_data.py" d || { echo "cannot make data"; exit 1; }
command -v h5dump >/dev/null || { echo "h5dump not found (Debian package hdf5-tools)"; exit 1; }
TEXT="$DTRAIN data import text"
TOK="$DTRAIN data import tokens"

# ---- the help ---------------------------------------------------------------
expect 0 "text FILE\.\.\. \[--val-fraction F\]" -- $DTRAIN data import --help
expect 0 "tokens --train F \[--val F\] \[--vocab-size N\] \[--tokenizer gpt2\|none\]" -- \
  $DTRAIN data import --help
expect 64 "formats:" -- $DTRAIN data import
expect 64 "unknown format 'bpe' \(this version imports: idx, npy, csv, text, tokens" -- \
  $DTRAIN data import bpe
expect 0 "data import tokens --train F" -- $DTRAIN --help

# ---- text -------------------------------------------------------------------
expect 0 "train: [0-9]+ tokens \(uint16\) from d/a.txt, d/b.txt" -- $TEXT d/a.txt d/b.txt -o t.h5
attr t.h5 dtrain_format '"dataset"'
attr t.h5 format_version 1
attr t.h5 task '"language_model"'
attr t.h5 vocab_size 256
attr t.h5 tokenizer '"byte"'
splits t.h5 "train val"
dtype t.h5 train H5T_STD_U16LE
dtype t.h5 val H5T_STD_U16LE
text_expect exp_t 0.1 d/a.txt d/b.txt
tokens t.h5 train exp_t.train
tokens t.h5 val exp_t.val
# a cut inside the first file: val spans both; a glob in the shell's order
expect 0 "val: [0-9]+ tokens \(uint16\) from d/a.txt \.\.\. d/tiny.txt \(3 files\) \(bytes [0-9]+ to [0-9]+ of the stream; cut at a byte" -- \
  $TEXT d/*.txt -o t9.h5 --val-fraction 0.9
text_expect exp_t9 0.9 d/*.txt
tokens t9.h5 train exp_t9.train
tokens t9.h5 val exp_t9.val
# a cut inside a UTF-8 character is kept as bytes
expect 0 "wrote t5.h5" -- $TEXT d/b.txt -o t5.h5 --val-fraction 0.5
text_expect exp_t5 0.5 d/b.txt
tokens t5.h5 train exp_t5.train
tokens t5.h5 val exp_t5.val

# ---- nanoGPT and llm.c token files ------------------------------------------
expect 0 "train: 5000 tokens \(uint16\) from d/nano_train.bin \(nanoGPT-style raw uint16" -- \
  $TOK --train d/nano_train.bin --val d/nano_val.bin -o n.h5
attr n.h5 task '"language_model"'
attr n.h5 vocab_size 50257
attr n.h5 tokenizer '"gpt2"'
splits n.h5 "train val"
dtype n.h5 train H5T_STD_U16LE
tokens n.h5 train d/nano_train.bin.expect
tokens n.h5 val d/nano_val.bin.expect
expect 0 "val: 400 tokens \(uint16\) from d/llmc_val.bin \(llm.c header, GPT-2 uint16 tokens\)" -- \
  $TOK --train d/llmc_train.bin --val d/llmc_val.bin -o l.h5
tokens l.h5 train d/llmc_train.bin.expect
tokens l.h5 val d/llmc_val.bin.expect
# train only; one format for train and another for val
expect 0 "wrote l1.h5" -- $TOK --train d/llmc_train.bin -o l1.h5
splits l1.h5 "train"
expect 0 "wrote mix.h5" -- $TOK --train d/nano_train.bin --val d/llmc_val.bin -o mix.h5
tokens mix.h5 val d/llmc_val.bin.expect
# more than one chunk; a vocabulary past 65536 stores int32; tokenizer none
expect 0 "train: 1300000 tokens \(int32\)" -- $TOK --train d/nano_big.bin -o big32.h5 \
  --vocab-size 70000 --tokenizer none
attr big32.h5 vocab_size 70000
attr big32.h5 tokenizer '"none"'
dtype big32.h5 train H5T_STD_I32LE
tokens big32.h5 train d/nano_big.bin.expect32
expect 0 "train: 1300000 tokens \(uint16\)" -- $TOK --train d/nano_big.bin -o big.h5 --vocab-size 50304
attr big.h5 vocab_size 50304
tokens big.h5 train d/nano_big.bin.expect
# llm.c Llama 3 (uint32 tokens): vocabulary 128256 and tokenizer none by default
expect 0 "vocab_size 128256" -- $TOK --train d/llama_train.bin -o llama.h5
attr llama.h5 tokenizer '"none"'
dtype llama.h5 train H5T_STD_I32LE
tokens llama.h5 train d/llama_train.bin.expect

# ---- bad token files: 65, the file named, nothing written ---------------------
tok_bad() { # FILE PATTERN [as val]
  if [ "${3:-}" = val ]; then
    expect 65 "token file d/$1: .*$2" -- $TOK --train d/nano_train.bin --val "d/$1" -o bad.h5
  else
    expect 65 "token file d/$1: .*$2" -- $TOK --train "d/$1" -o bad.h5
  fi
  no_output bad.h5
}
tok_bad bad_magic.bin "token 0 \(byte 0\) is 55431, not below the vocabulary size 50257 .*first 4 bytes read as an int32 are 20240519: if it is an llm.c token file, its magic is not one"
tok_bad bad_version.bin "llm.c header version 2 is not supported \(magic 20240520 goes with version 1"
tok_bad bad_count.bin "the llm.c header says 100 tokens \(a file of 1224 bytes\) but the file holds 1222 bytes"
tok_bad bad_negcount.bin "the llm.c header says -4 tokens"
tok_bad bad_trunc_header.bin "holds 500 bytes, less than its 1024-byte header"
tok_bad bad_odd.bin "201 bytes, an odd number" val
tok_bad bad_eval.bin "llm.c's evaluation file"
tok_bad bad_npy.bin "this is a NumPy .npy file \(numpy.save\), not a token file; write the tokens with"
tok_bad bad_h5.bin "this is an HDF5 file, not a token file"
tok_bad bad_one.bin "holds 1 token; a split needs at least 2"
tok_bad bad_empty.bin "holds 0 tokens"
tok_bad bad_token.bin "token 123 \(byte 246\) is 50257, not below the vocabulary size 50257"
tok_bad bad_token_llmc.bin "token 77 \(byte 1178\) is 60000, not below the vocabulary size 50257"
tok_bad bad_token_late.bin "token 1050000 \(byte 2100000\) is 65535" val
# the same values are fine with a larger vocabulary
expect 0 "wrote ok.h5" -- $TOK --train d/bad_token.bin -o ok.h5 --vocab-size 50304
expect 66 "token file d/missing.bin: no such file" -- $TOK --train d/missing.bin -o bad.h5
expect 66 "token file d: not a regular file" -- $TOK --train d/nano_train.bin --val d -o bad.h5
mkfifo d/fifo.bin
expect 66 "token file d/fifo.bin: not a regular file" -- $TOK --train d/fifo.bin -o bad.h5
expect 66 "text file d/fifo.bin: not a regular file" -- $TEXT d/a.txt d/fifo.bin -o bad.h5
no_output bad.h5
expect 64 "Llama 3 tokens .* use --tokenizer none" -- $TOK --train d/llama_train.bin \
  --tokenizer gpt2 -o bad.h5
expect 64 "--vocab-size 1000 is smaller than GPT-2's 50257" -- $TOK --train d/nano_train.bin \
  --vocab-size 1000 -o bad.h5
expect 64 "--vocab-size '1' is outside 2 to 16777216" -- $TOK \
  --train d/nano_train.bin --vocab-size 1 -o bad.h5
expect 64 "--vocab-size '99999999' is outside 2 to 16777216" -- $TOK --train d/nano_train.bin \
  --vocab-size 99999999 -o bad.h5
# a number of any length is said to be out of range, not "not a whole number"
expect 64 "--vocab-size '1000000000000000000000000000000' is outside 2 to 16777216" -- $TOK \
  --train d/nano_train.bin --vocab-size 1000000000000000000000000000000 -o bad.h5
expect 64 "--vocab-size '50257.0' is not a whole number" -- $TOK --train d/nano_train.bin \
  --vocab-size 50257.0 -o bad.h5
expect 64 "--tokenizer 'bpe': expected gpt2 or none" -- $TOK --train d/nano_train.bin \
  --tokenizer bpe -o bad.h5
expect 64 "need --train FILE" -- $TOK --val d/nano_val.bin -o bad.h5
expect 64 "no output file" -- $TOK --train d/nano_train.bin
no_output bad.h5

# a file-size limit below the output's size: 74 before any token is written
expect 74 "dataset big_lim.h5.tmp.[^ ]+\.[0-9]+: needs about .*File too large \(the file-size limit, ulimit -f" -- \
  bash -c "ulimit -f 256 && exec $TOK --train d/nano_big.bin -o big_lim.h5"
no_output big_lim.h5

# ---- bad text -----------------------------------------------------------------
expect 65 "text file d/empty.txt is empty" -- $TEXT d/empty.txt -o bad.h5
expect 65 "the 2 text files d/empty.txt ... d/empty2.txt are all empty" -- \
  $TEXT d/empty.txt d/empty2.txt -o bad.h5
expect 65 "text file d/tiny.txt: 9 bytes in all; with --val-fraction 0.1 split 'val' gets 1 byte" -- \
  $TEXT d/tiny.txt -o bad.h5
expect 65 "split 'train' gets 1 byte" -- $TEXT d/tiny.txt -o bad.h5 --val-fraction 0.85
# gzipped input is refused, not imported as its compressed bytes
gzip -c d/b.txt > d/b.txt.gz
expect 65 "text file d/b.txt.gz: gzip-compressed; decompress it first" -- $TEXT d/a.txt d/b.txt.gz -o bad.h5
gzip -c d/nano_train.bin > d/nano_train.bin.gz
expect 65 "token file d/nano_train.bin.gz: gzip-compressed; decompress it first" -- \
  $TOK --train d/nano_train.bin.gz -o bad.h5
no_output bad.h5
expect 66 "text file d/nope.txt: no such file" -- $TEXT d/a.txt d/nope.txt -o bad.h5
expect 66 "text file d: not a regular file" -- $TEXT d -o bad.h5
no_output bad.h5
for f in 0 1 -0.5 1e999 abc 0.5x; do
  expect 64 "--val-fraction '$f' is .*expected a number between 0 and 1" -- $TEXT d/a.txt \
    -o bad.h5 --val-fraction "$f"
done
expect 64 "--val-fraction 'abc' is not a number" -- $TEXT d/a.txt -o bad.h5 --val-fraction abc
expect 64 "--val-fraction '1e999' is outside \(0, 1\)" -- $TEXT d/a.txt -o bad.h5 \
  --val-fraction 1e999
expect 64 "--val-fraction '1e-400' is too close to 0 to be told from it" -- $TEXT d/a.txt \
  -o bad.h5 --val-fraction 1e-400
expect 64 "no input files" -- $TEXT -o bad.h5
expect 64 "unknown option '--bogus'" -- $TEXT d/a.txt -o bad.h5 --bogus
no_output bad.h5
if [ "$(id -u)" != 0 ]; then
  cp d/a.txt d/noread.txt && chmod 000 d/noread.txt
  expect 66 "text file d/noread.txt: cannot read it" -- $TEXT d/noread.txt -o bad.h5
  no_output bad.h5
fi

# ---- an existing output: refused without --force, kept by a failed import -----
before=$(cksum < n.h5)
expect 64 "output n.h5 already exists; pass --force" -- $TOK --train d/nano_train.bin -o n.h5
expect 64 "output n.h5 already exists; pass --force" -- $TEXT d/a.txt -o n.h5
[ "$(cksum < n.h5)" = "$before" ] && ok || bad "n.h5 changed without --force"
expect 65 "bad_token.bin" -- $TOK --train d/bad_token.bin -o n.h5 --force
[ "$(cksum < n.h5)" = "$before" ] && ok || bad "n.h5 changed by a failed --force import"
ls n.h5.tmp.* >/dev/null 2>&1 && bad "temporary file left: $(ls n.h5.tmp.*)" || ok
expect 0 "wrote n.h5" -- $TOK --train d/llmc_train.bin -o n.h5 --overwrite
tokens n.h5 train d/llmc_train.bin.expect
expect 0 "wrote n.h5" -- $TEXT d/a.txt -o n.h5 --force
attr n.h5 tokenizer '"byte"'

echo "lm import tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
