#!/usr/bin/env python3
"""Writes the .npy and CSV files the import tests read, good and bad, in
plain Python (the .npy format is written byte for byte as numpy.save writes
it, so the tests need no numpy):
   make_import_data.py OUTDIR"""
import random
import struct
import sys

SIDE = 6


def npy(path, descr, shape, payload, version=1, fortran=False, header=None):
    if header is None:
        shp = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
            descr, "True" if fortran else "False", shp)
    hb = header.encode("latin1")
    pre = 10 if version == 1 else 12
    pad = (64 - (pre + len(hb) + 1) % 64) % 64
    hb += b" " * pad + b"\n"
    lenfield = struct.pack("<H", len(hb)) if version == 1 else struct.pack("<I", len(hb))
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY" + bytes([version, 0]) + lenfield + hb + payload)


def samples(n, classes, rng):
    """Class c lights up block c of a SIDE x SIDE image (learnable)."""
    xs, ys = [], []
    for _ in range(n):
        c = rng.randrange(classes)
        img = []
        for r in range(SIDE):
            for col in range(SIDE):
                block = (r // 3) * 2 + (col // 3)
                v = 200 if block == c else 30
                img.append(max(0, min(255, v + rng.randint(-30, 30))))
        xs.append(img)
        ys.append(c)
    return xs, ys


def pack(fmt, values):
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def main():
    out = sys.argv[1]
    rng = random.Random(7)
    classes = 4
    ntr, nte = 400, 100
    xtr, ytr = samples(ntr, classes, rng)
    xte, yte = samples(nte, classes, rng)
    flat = lambda xs: [v for s in xs for v in s]
    shp_tr, shp_te = (ntr, SIDE, SIDE), (nte, SIDE, SIDE)

    # good: uint8 x, int64 y; the other dtypes of x
    npy(f"{out}/train_x.npy", "|u1", shp_tr, bytes(flat(xtr)))
    npy(f"{out}/train_y.npy", "<i8", (ntr,), pack("q", ytr))
    npy(f"{out}/test_x.npy", "|u1", shp_te, bytes(flat(xte)))
    npy(f"{out}/test_y.npy", "<i8", (nte,), pack("q", yte))
    npy(f"{out}/train_x_f32.npy", "<f4", shp_tr, pack("f", [v / 255 for v in flat(xtr)]))
    npy(f"{out}/test_x_f32.npy", "<f4", shp_te, pack("f", [v / 255 for v in flat(xte)]))
    npy(f"{out}/train_x_f16.npy", "<f2", shp_tr, pack("e", [v / 255 for v in flat(xtr)]))
    npy(f"{out}/train_x_f64.npy", "<f8", shp_tr, pack("d", [v / 255 for v in flat(xtr)]), version=2)
    npy(f"{out}/train_x_i16.npy", "<i2", shp_tr, pack("h", flat(xtr)), version=3)
    npy(f"{out}/train_y_u1.npy", "|u1", (ntr,), bytes(ytr))
    npy(f"{out}/train_y_i4.npy", "<i4", (ntr,), pack("i", ytr))

    # bad
    npy(f"{out}/fortran.npy", "|u1", shp_tr, bytes(flat(xtr)), fortran=True)
    npy(f"{out}/bigend.npy", ">f4", shp_tr, struct.pack(">%df" % (ntr * SIDE * SIDE),
                                                          *[v / 255 for v in flat(xtr)]))
    npy(f"{out}/complex.npy", "<c8", (ntr, 2), b"\0" * (ntr * 2 * 8))
    npy(f"{out}/baddict.npy", None, None, b"", header="{'descr': '<f4', 'shape': (4, 2) ")
    npy(f"{out}/evil.npy", None, None, b"", header="__import__('os').system('false')")
    npy(f"{out}/huge.npy", "<f4", (1 << 40, 1 << 30, 1 << 20), b"\0" * 64)
    npy(f"{out}/bigshape.npy", "<f4", (1 << 20, 1 << 20), b"\0" * 64)
    npy(f"{out}/truncated.npy", "|u1", shp_tr, bytes(flat(xtr))[:1000])
    nan = [v / 255 for v in flat(xtr)]
    nan[5 * SIDE * SIDE + 3] = float("nan")
    npy(f"{out}/nan.npy", "<f4", shp_tr, pack("f", nan))
    npy(f"{out}/y_range.npy", "<i8", (ntr,), pack("q", ytr[:10] + [-1] + ytr[11:]))
    npy(f"{out}/y_float.npy", "<f4", (ntr,), pack("f", ytr))
    npy(f"{out}/y_short.npy", "<i8", (ntr - 1,), pack("q", ytr[:-1]))
    npy(f"{out}/x_1d.npy", "<f4", (ntr,), pack("f", ytr))
    with open(f"{out}/notnpy.npy", "wb") as f:
        f.write(b"PK\3\4 this is a zip, not an array")
    npy(f"{out}/v9.npy", "|u1", (1, 1), b"\0")
    with open(f"{out}/v9.npy", "r+b") as f:
        f.seek(6)
        f.write(bytes([9]))
    with open(f"{out}/hugehdr.npy", "wb") as f:
        f.write(b"\x93NUMPY\2\0" + struct.pack("<I", 0xFFFFFFF0) + b"{")

    # CSV: 3 classes separable along the first two features, 5 features
    def rows(n, rng):
        lines = []
        for _ in range(n):
            c = rng.randrange(3)
            f = [(c - 1) * 3 + rng.gauss(0, 0.5), (c % 2) * 2 + rng.gauss(0, 0.5)]
            f += [rng.gauss(0, 1) for _ in range(3)]
            lines.append((c, f))
        return lines
    tr, te = rows(600, rng), rows(150, rng)
    with open(f"{out}/train.csv", "w") as fh:
        fh.write("label,a,b,c,d,e\n")
        for c, f in tr:
            fh.write("%d,%s\n" % (c, ",".join("%.5f" % v for v in f)))
    with open(f"{out}/test.csv", "w") as fh:
        fh.write("label,a,b,c,d,e\r\n")
        for c, f in te:
            fh.write("%d,%s\r\n" % (c, ",".join("%.5f" % v for v in f)))
    # no header, label last
    with open(f"{out}/lastcol.csv", "w") as fh:
        for c, f in tr[:50]:
            fh.write("%s,%d\n" % (",".join("%.5f" % v for v in f), c))
    good = ["%d,%s" % (c, ",".join("%.5f" % v for v in f)) for c, f in tr[:20]]
    bad = {
        "cols": good[:7] + ["1,2.0,3.0"] + good[7:],
        "nonnum": good[:4] + ["2,0.5,abc,0.1,0.2,0.3"] + good[4:],
        "nonfinite": good[:4] + ["2,0.5,inf,0.1,0.2,0.3"] + good[4:],
        "nan": good[:4] + ["2,0.5,0.1,nan,0.2,0.3"] + good[4:],
        "neglabel": good[:4] + ["-1,0.5,0.1,0.1,0.2,0.3"] + good[4:],
        "fraclabel": good[:4] + ["1.5,0.5,0.1,0.1,0.2,0.3"] + good[4:],
        "biglabel": good[:4] + ["7,0.5,0.1,0.1,0.2,0.3"] + good[4:],
        "overflow": good[:4] + ["1,0.5,1e39,0.1,0.2,0.3"] + good[4:],
    }
    for name, lines in bad.items():
        with open(f"{out}/bad_{name}.csv", "w") as fh:
            fh.write("\n".join(lines) + "\n")
    open(f"{out}/empty.csv", "w").close()
    with open(f"{out}/headeronly.csv", "w") as fh:
        fh.write("label,a,b\n")
    # as Excel writes them: a UTF-8 byte-order mark, with and without a header
    bom = b"\xef\xbb\xbf"
    with open(f"{out}/bom.csv", "wb") as fh:
        fh.write(bom + "".join(line + "\n" for line in good).encode())
    with open(f"{out}/bom_header.csv", "wb") as fh:
        fh.write(bom + ("a,label,b,c,d,e\n" + "".join(
            "%.5f,%d,%s\n" % (f[0], c, ",".join("%.5f" % v for v in f[1:]))
            for c, f in tr[:20])).encode())
    with open(f"{out}/utf16.csv", "wb") as fh:
        fh.write(("label,a\n0,1\n").encode("utf-16"))
    # two columns of the label's name
    with open(f"{out}/twice.csv", "w") as fh:
        fh.write("y,y,f\n" + "".join("%d,%d,%.5f\n" % (c, c, f[0]) for c, f in tr[:20]))
    # old Mac line ends: a lone CR; and one file of all three kinds
    with open(f"{out}/cr.csv", "wb") as fh:
        fh.write(("label,a,b,c,d,e\r" + "\r".join(good) + "\r").encode())
    with open(f"{out}/mixed.csv", "wb") as fh:
        ends = ["\n", "\r\n", "\r"]
        fh.write(("label,a,b,c,d,e\r\n" + "".join(
            line + ends[i % 3] for i, line in enumerate(good))).encode())
    # numbers longer than any fixed buffer: 200 digits, in and out of float32's range
    with open(f"{out}/long_ok.csv", "w") as fh:
        fh.write("label,a\n0,1.%s\n1,0.%s25\n" % ("0" * 200, "0" * 200))
    with open(f"{out}/long_big.csv", "w") as fh:
        fh.write("label,a\n0,1\n1,%s\n" % ("1" * 200))
    with open(f"{out}/long_huge.csv", "w") as fh:
        fh.write("label,a\n0,1\n1,%s\n" % ("9" * 400))
    # a header longer than the summary shows
    with open(f"{out}/wide_header.csv", "w") as fh:
        fh.write("label," + ",".join("feature_%03d" % i for i in range(40)) + "\n")
        fh.write("0," + ",".join("1" for _ in range(40)) + "\n")


if __name__ == "__main__":
    main()
