#!/usr/bin/env python3
"""Writes the inputs of lm_import_test.sh into DIR: text files, token files
as nanoGPT writes them (raw little-endian uint16) and as llm.c writes them
(256 little-endian int32 of header: magic, version, token count; then the
tokens), and damaged variants of each. Standard library only.
    make_lm_data.py DIR
For each good token file F it also writes F.expect: the tokens as the
importer must store them (little-endian uint16 or int32)."""
import os
import struct
import sys
from array import array

GPT2_MAGIC, GPT2_VERSION = 20240520, 1
LLAMA3_MAGIC, LLAMA3_VERSION = 20240801, 7


def tokens(n, vocab, seed):
    """n deterministic tokens in [0, vocab), covering both ends."""
    t = [(i * 7919 + seed * 104729 + (i * i) % 977) % vocab for i in range(n)]
    t[0], t[-1] = vocab - 1, 0
    return t


def le(typecode, values):
    a = array(typecode, values)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def header(magic, version, count):
    return struct.pack("<256i", magic, version, count, *([0] * 253))


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    p = lambda name: os.path.join(d, name)

    # text: two files, the second with multi-byte UTF-8 characters
    write(p("a.txt"), ("The quick brown fox jumps over the lazy dog. " * 20).encode())
    write(p("b.txt"), "Über naïve café: ünïcödé text, second file.\n".encode() * 5)
    write(p("empty.txt"), b"")
    write(p("empty2.txt"), b"")
    write(p("tiny.txt"), b"abcdefghi")  # 9 bytes: val gets 1 byte at 0.1

    # nanoGPT: raw uint16, no header
    train, val = tokens(5000, 50257, 1), tokens(600, 50257, 2)
    write(p("nano_train.bin"), le("H", train))
    write(p("nano_train.bin.expect"), le("H", train))
    write(p("nano_val.bin"), le("H", val))
    write(p("nano_val.bin.expect"), le("H", val))
    # more than one 1 Mi-token chunk of the importer
    big = tokens(1300000, 50257, 3)
    write(p("nano_big.bin"), le("H", big))
    write(p("nano_big.bin.expect"), le("H", big))
    write(p("nano_big.bin.expect32"), le("i", big))

    # llm.c, GPT-2: header then uint16
    ltrain, lval = tokens(3000, 50257, 4), tokens(400, 50257, 5)
    write(p("llmc_train.bin"), header(GPT2_MAGIC, GPT2_VERSION, len(ltrain)) + le("H", ltrain))
    write(p("llmc_train.bin.expect"), le("H", ltrain))
    write(p("llmc_val.bin"), header(GPT2_MAGIC, GPT2_VERSION, len(lval)) + le("H", lval))
    write(p("llmc_val.bin.expect"), le("H", lval))
    # llm.c, Llama 3: header then uint32, ids past 65535
    llama = tokens(2000, 128256, 6)
    write(p("llama_train.bin"), header(LLAMA3_MAGIC, LLAMA3_VERSION, len(llama)) + le("I", llama))
    write(p("llama_train.bin.expect"), le("i", llama))

    # damaged token files
    write(p("bad_magic.bin"), header(20240519, 1, 100) + le("H", tokens(100, 50257, 7)))
    write(p("bad_version.bin"), header(GPT2_MAGIC, 2, 100) + le("H", tokens(100, 50257, 8)))
    write(p("bad_count.bin"), header(GPT2_MAGIC, GPT2_VERSION, 100) + le("H", tokens(99, 50257, 9)))
    write(p("bad_negcount.bin"), header(GPT2_MAGIC, GPT2_VERSION, -4) + le("H", [1, 2]))
    write(p("bad_trunc_header.bin"), header(GPT2_MAGIC, GPT2_VERSION, 10)[:500])
    write(p("bad_odd.bin"), le("H", tokens(100, 50257, 10)) + b"\x01")
    write(p("bad_eval.bin"), header(20240522, 1, 10) + le("H", [65535] * 10))
    write(p("bad_one.bin"), le("H", [42]))
    write(p("bad_empty.bin"), b"")
    t = tokens(500, 50257, 11)
    t[123] = 50257
    write(p("bad_token.bin"), le("H", t))
    t = tokens(300, 50257, 12)
    t[77] = 60000
    write(p("bad_token_llmc.bin"), header(GPT2_MAGIC, GPT2_VERSION, len(t)) + le("H", t))
    # a .npy (numpy.save) and an HDF5 file given as token files
    npy_header = "{'descr': '<u2', 'fortran_order': False, 'shape': (100,), }"
    npy_header += " " * (118 - len(npy_header)) + "\n"
    write(p("bad_npy.bin"), b"\x93NUMPY\x01\x00" + struct.pack("<H", 118) + npy_header.encode()
          + le("H", tokens(100, 50257, 14)))
    write(p("bad_h5.bin"), b"\x89HDF\r\n\x1a\n" + bytes(502))
    # a good first half and a bad token past the first 1 Mi-token chunk
    t = tokens(1100000, 50257, 13)
    t[1050000] = 65535
    write(p("bad_token_late.bin"), le("H", t))


if __name__ == "__main__":
    main()
