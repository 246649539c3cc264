#!/usr/bin/env python3
"""Writes small IDX files for the CLI tests: N images of SIDE x SIDE with a
learnable pattern (class c lights up block c) plus noise, gzipped or raw.
   make_idx.py OUTDIR N_TRAIN N_TEST CLASSES [raw]"""
import gzip
import random
import struct
import sys

SIDE = 8


def images_and_labels(n, classes, rng):
    imgs, labels = bytearray(), bytearray()
    for _ in range(n):
        c = rng.randrange(classes)
        labels.append(c)
        for r in range(SIDE):
            for col in range(SIDE):
                block = (r // 4) * 2 + (col // 4)
                v = 200 if block == c else 30
                imgs.append(max(0, min(255, v + rng.randint(-30, 30))))
    return imgs, labels


def write(path, magic, dims, payload, raw):
    data = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + bytes(payload)
    if raw:
        open(path, "wb").write(data)
    else:
        with gzip.open(path, "wb") as f:
            f.write(data)


def main():
    out, ntr, nte, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    raw = len(sys.argv) > 5 and sys.argv[5] == "raw"
    ext = "" if raw else ".gz"
    rng = random.Random(1234)
    for prefix, n in (("train", ntr), ("t10k", nte)):
        imgs, labels = images_and_labels(n, classes, rng)
        write(f"{out}/{prefix}-images-idx3-ubyte{ext}", 0x803, (n, SIDE, SIDE), imgs, raw)
        write(f"{out}/{prefix}-labels-idx1-ubyte{ext}", 0x801, (n,), labels, raw)


if __name__ == "__main__":
    main()
