#!/usr/bin/env python3
"""Writes small image datasets as .npy files, in plain Python (the format
byte for byte, no numpy needed), for the command-line tests.

    make_bright_npy.py SEED TRAIN_ROWS TEST_ROWS

For each split (train, test): {split}_x.npy, uint8 images of 3 x 8 x 8 whose
class (0..2) is their brightest channel, and {split}_y.npy their int32
labels; {split}_x1.npy and {split}_y1.npy the same pixels as single-channel
8 x 8 images (each channel a row of its own, labelled like its image);
{split}_v.npy float32 vectors of 16 values in [0, 1) (data no image
augmentation applies to).
"""
import random
import struct
import sys


def npy(path, descr, shape, payload):
    shp = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    hb = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shp)).encode()
    pad = (64 - (10 + len(hb) + 1) % 64) % 64
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hb) + pad + 1) + hb + b" " * pad + b"\n")
        f.write(payload)


def main():
    seed, n_train, n_test = (int(a) for a in sys.argv[1:4])
    rng = random.Random(seed)
    C, H, W = 3, 8, 8
    for split, n in (("train", n_train), ("test", n_test)):
        xs, ys = bytearray(), []
        for i in range(n):
            k = i % C
            for c in range(C):
                base = 150 if c == k else 60 + 20 * c
                xs += bytes(min(255, max(0, base + rng.randint(-40, 40))) for _ in range(H * W))
            ys.append(k)
        npy(f"{split}_x.npy", "|u1", (n, C, H, W), bytes(xs))
        npy(f"{split}_x1.npy", "|u1", (n * C, H, W), bytes(xs))
        npy(f"{split}_y.npy", "<i4", (n,), struct.pack("<%di" % n, *ys))
        y1 = [y for y in ys for _ in range(C)]
        npy(f"{split}_y1.npy", "<i4", (n * C,), struct.pack("<%di" % (n * C), *y1))
        v = [rng.random() for _ in range(n * 16)]
        npy(f"{split}_v.npy", "<f4", (n, 16), struct.pack("<%df" % (n * 16), *v))


if __name__ == "__main__":
    main()
