"""dtrain's GPT-2 byte-level BPE (io/bpe.c) against Hugging Face tokenizers.

- A byte-level BPE (vocabulary 3000, special token <|endoftext|>) is
  trained with tokenizers on this repository's docs and sources and on a
  text of accents, CJK, Arabic and Korean scripts, emoji (with skin tones
  and ZWJ sequences), numbers, contractions, tabs, CRLF, no-break and em
  spaces and a literal <|endoftext|>.
- `dtrain data import text --tokenizer` of two files (over 1 MB in all)
  gives, token for token, tokenizers' encoding of each file followed by
  <|endoftext|>; the dataset says tokenizer bpe and keeps both files.
- bpe_tool decodes dtrain's tokens back to the file's bytes (also for
  bytes that are not UTF-8) and its ids equal tokenizers' on the whole
  text.
- A GPT trained a few steps on the dataset generates from a prompt with
  the cache and without it the same text, which starts with the prompt;
  exported (`dtrain export`, which puts the dataset's tokenizer files in
  the directory), transformers' AutoTokenizer encodes the prompt as
  dtrain does and GPT2LMHeadModel's greedy continuation is dtrain's.
- A malformed merges.txt and a vocab.json without the byte symbols are
  refused (65) with the file named, and leave no dataset.

  bpe_test.py --dtrain DTRAIN --tool BPE_TOOL --workdir DIR --source SRC
Exits 77 when tokenizers cannot be imported.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys

try:
    import h5py
    import numpy as np
    from tokenizers import ByteLevelBPETokenizer
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (DTRAIN_WITH_HF=1 bash launch/setup.sh makes build/hf-venv)")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("--dtrain", required=True)
ap.add_argument("--tool", required=True)
ap.add_argument("--workdir", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()
shutil.rmtree(args.workdir, ignore_errors=True)
os.makedirs(args.workdir)
os.chdir(args.workdir)
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def dtrain(*cmd, want=0):
    p = subprocess.run([args.dtrain, *cmd], capture_output=True, text=True)
    if p.returncode != want:
        print(p.stdout + p.stderr)
        raise SystemExit(f"dtrain {' '.join(cmd)}: exit {p.returncode}, expected {want}")
    return p.stdout + p.stderr


src = []
for pattern in ("docs/*.md", "README.md", "io/*.c", "runtime/*/*.c", "kernels/cpu/*.c"):
    src += sorted(glob.glob(os.path.join(args.source, pattern)))
world = ("Café naïve résumé Ærøskøbing façade — “quotes” ‘single’ «guillemets» "
         "日本語のテキストです。中文文本，标点。한국어 텍스트 العربية ١٢٣ "
         "😀🎉👍🏽 👨‍👩‍👧 🇫🇷 ñandú Straße İstanbul ǅ ½ ⅔ Ⅻ x² "
         "I'll we've they're it's I'm he'd don't DON'T 'quoted' \t tab\r\nCRLF line\n"
         "a\u00a0no-break\u2003em space  two  spaces   three\n\n\nparagraph <|endoftext|> after\n"
         "numbers 3.14159 2026-12-05 1,000,000 0x1F $5 #tag @user https://example.org/a?b=c\n")
open("world.txt", "w", encoding="utf-8").write(world * 300)
corpus = b"".join(open(f, "rb").read() for f in src)
open("corpus.txt", "wb").write(corpus)
tok = ByteLevelBPETokenizer()
tok.train(["corpus.txt", "world.txt"], vocab_size=3000, min_frequency=2,
          special_tokens=["<|endoftext|>"], show_progress=False)
os.makedirs("tok")
tok.save_model("tok")
tok = ByteLevelBPETokenizer("tok/vocab.json", "tok/merges.txt")
tok.add_special_tokens(["<|endoftext|>"])
eot = tok.token_to_id("<|endoftext|>")

# two documents, over 1 MB in all
a = (corpus.decode("utf-8") + world * 50)
while len(a.encode()) < 900_000:
    a += corpus.decode("utf-8")
b = world * 100 + corpus.decode("utf-8")[:200_000]
open("a.txt", "w", encoding="utf-8").write(a)
open("b.txt", "w", encoding="utf-8").write(b)
size = os.path.getsize("a.txt") + os.path.getsize("b.txt")
check(size >= 1_000_000, f"the text is {size} bytes")
dtrain("data", "import", "text", "a.txt", "b.txt", "-o", "bpe.h5", "--tokenizer", "tok")
want = tok.encode(a).ids + [eot] + tok.encode(b).ids + [eot]
with h5py.File("bpe.h5", "r") as f:
    got = np.concatenate([f["train/tokens"][:], f["val/tokens"][:]]).astype(np.int64).tolist()
    kept = bytes(f["tokenizer/vocab.json"][:]) == open("tok/vocab.json", "rb").read() and \
        bytes(f["tokenizer/merges.txt"][:]) == open("tok/merges.txt", "rb").read()
    attrs = (f.attrs["tokenizer"], int(f.attrs["vocab_size"]))
first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
check(got == want, f"{len(got)} tokens from dtrain, {len(want)} from tokenizers"
      + ("" if first is None else f"; first difference at {first}: {got[first:first + 5]} "
                                  f"against {want[first:first + 5]}"))
check(kept and attrs[0] in ("bpe", b"bpe") and attrs[1] == 3000,
      f"the dataset keeps the tokenizer's files, tokenizer {attrs[0]}, vocab_size {attrs[1]}")

# decoding, and bytes that are not UTF-8
open("whole.txt", "wb").write(a.encode() + b"\xff\xfe broken \xe2\x82 utf-8 \xc3" + b.encode())
out = subprocess.run([args.tool, "tok", "whole.txt", "1", "ids.bin"], capture_output=True,
                     text=True)
check(out.returncode == 0, f"bpe_tool decodes its tokens to the file's bytes: {out.stdout.strip()}"
      f"{out.stderr.strip()}")
open("valid.txt", "wb").write((a + b).encode())
subprocess.run([args.tool, "tok", "valid.txt", "1", "ids2.bin"], check=True, capture_output=True)
check(np.fromfile("ids2.bin", dtype=np.int32).tolist() == tok.encode(a + b).ids,
      "the whole text in one call: the same ids as tokenizers")

# generation with the dataset's tokenizer
open("g.yaml", "w").write("""model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 32, dropout: 0}
data: {path: bpe.h5, test_split: val, seq_len: 32}
train: {steps: 20, global_batch: 8, log_every: 10, optimizer: {name: adamw, lr: 0.003}}
runtime: {progress: off}
output: {dir: run}
""")
dtrain("train", "g.yaml")
prompt = "The café's 日本語 "
texts = [subprocess.run([args.dtrain, "generate", "g.yaml", "--checkpoint", "run/model.h5",
                         "--prompt", prompt, "--tokens", "60", "--seed", "3", *extra],
                        capture_output=True).stdout for extra in ([], ["--no-cache"])]
check(texts[0] == texts[1] and texts[0].startswith(prompt.encode()) and len(texts[0]) > len(prompt),
      f"generation with the dataset's tokenizer, cache and no cache: {texts[0][:60]!r}")

# the round trip: the GPT exported with the dataset's tokenizer; transformers
# encodes the prompt as dtrain does and its greedy continuation is dtrain's
dtrain("export", "g.yaml", "--checkpoint", "run/model.h5", "-o", "g-hf")
try:
    import torch
    import transformers
    htok = transformers.AutoTokenizer.from_pretrained("g-hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained("g-hf").eval()
    ids = htok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        cont = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    # the bytes the tokens stand for: transformers' default clean-up would
    # drop the space of a token such as " ," ("x ," decodes as "x,")
    theirs = htok.decode(cont[0], clean_up_tokenization_spaces=False).encode()
    ours = subprocess.run([args.dtrain, "generate", "g.yaml", "--checkpoint", "g-hf", "--prompt",
                           prompt, "--tokens", "12", "--temperature", "0"],
                          capture_output=True).stdout
    check(ids[0].tolist() == tok.encode(prompt).ids and ours == theirs
          and hf.config.eos_token_id == eot,
          f"exported with its tokenizer: transformers' greedy text {theirs[:50]!r}, dtrain's "
          f"{ours[:50]!r}")
except ImportError as e:
    check(False, f"transformers: {e}")

# bad tokenizer files
os.makedirs("bad")
shutil.copy("tok/vocab.json", "bad/vocab.json")
lines = open("tok/merges.txt", encoding="utf-8").read().splitlines()
lines[5] = lines[5].replace(" ", "")
open("bad/merges.txt", "w", encoding="utf-8").write("\n".join(lines) + "\n")
out = dtrain("data", "import", "text", "a.txt", "-o", "badm.h5", "--tokenizer", "bad", want=65)
check("merges.txt" in out and "line 6" in out and not os.path.exists("badm.h5"),
      f"a malformed merges.txt: 65, {out.strip().splitlines()[-1]}")
os.makedirs("bad2")
shutil.copy("tok/merges.txt", "bad2/merges.txt")
import json
v = json.load(open("tok/vocab.json", encoding="utf-8"))
del v["Ġ"]
json.dump(v, open("bad2/vocab.json", "w", encoding="utf-8"))
out = dtrain("data", "import", "text", "a.txt", "-o", "badv.h5", "--tokenizer", "bad2", want=65)
check("vocab.json" in out and "byte 0x20" in out and not os.path.exists("badv.h5"),
      f"a vocab.json without a byte symbol: 65, {out.strip().splitlines()[-1]}")
out = dtrain("data", "import", "text", "a.txt", "-o", "none.h5", "--tokenizer", "nowhere", want=66)
check("vocab.json" in out, "a missing tokenizer directory: 66")
print(f"bpe_test: {failures} failed")
sys.exit(1 if failures else 0)
