#!/usr/bin/env python3
"""corpus.py [BYTES] - writes BYTES (default 200000) of English-like text
to stdout: sentences drawn with a fixed seed from 180 words, each word
followed by one of nine fixed likely successors most of the time. The
same bytes on every machine and every run, so the language-model tests
that train on it do not move when anything else in the repository (its
documentation, say) is edited, and a model learns it well below the
unigram level within a few hundred steps."""
import random
import sys

WORDS = """checkpoint rank gradient step batch loss model layer tensor buffer device stream kernel
memory update optimizer shard bucket reduce gather scatter epoch sample token window sequence
train resume signal timeout watchdog coordinator backend precision scale clip norm weight bias
input output forward backward dropout attention head embedding vocabulary dataset loader cache
file folder record metric log error message status code exit node cluster job queue partition
the a an of to in on for with by from at as into over under after before while when where which
is are was were be been has have had will would can could should may might must does did
runs writes reads saves loads sums waits starts stops keeps drops fills copies moves checks
fast slow small large first last next every each one two four many few all some no other same
""".split()


def main():
    want = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
    rng = random.Random(20261204)
    succ = {w: rng.sample(WORDS, 9) for w in WORDS}
    out, size, w = [], 0, rng.choice(WORDS)
    while size < want:
        s = []
        for _ in range(rng.randint(5, 14)):
            s.append(w)
            w = rng.choice(succ[w]) if rng.random() < 0.85 else rng.choice(WORDS)
        line = " ".join(s).capitalize() + (". " if rng.random() < 0.8 else ".\n")
        out.append(line)
        size += len(line)
    print("".join(out))


if __name__ == "__main__":
    main()
