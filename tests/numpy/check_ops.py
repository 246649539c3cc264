#!/usr/bin/env python3
"""check_ops.py - the CPU backend's convolution, pooling, batch norm, layer
norm, RMS norm, attention and embedding forwards against NumPy written from the
definitions (PyTorch's conventions: cross-correlation, zero padding, groups
splitting channels in order, max pooling ignoring padding, average pooling
counting it, running variance unbiased; attention as
torch.nn.functional.scaled_dot_product_attention with is_causal, scale
1/sqrt(Dh)). Both op tables, odd shapes. op_dump (op_dump.c) runs
the op and writes inputs and outputs; this recomputes the outputs in
float64 from the same inputs.

  check_ops.py --driver PATH/op_dump --workdir DIR
Exit 0 when every output agrees to TOL (relative to the output's largest
value), 1 otherwise, 77 when NumPy is missing.
"""
import argparse
import os
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("check_ops: NumPy is not installed (python3-numpy); skipping")
    sys.exit(77)

TOL = 1e-5
EPS = 1e-5
MOMENTUM = 0.1

# N C H W K R S sh sw ph pw dh dw groups
CONV = [
    [2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1],
    [2, 4, 9, 8, 6, 3, 3, 2, 1, 1, 1, 1, 1, 2],
    [1, 3, 10, 11, 3, 3, 3, 1, 2, 2, 1, 2, 1, 3],
    [2, 5, 7, 7, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1],
    [1, 2, 8, 9, 4, 2, 3, 2, 2, 1, 1, 1, 2, 1],
    [2, 3, 7, 7, 6, 3, 3, 2, 2, 1, 1, 1, 1, 3],
    [2, 3, 9, 9, 5, 1, 1, 2, 2, 0, 0, 1, 1, 1],
    [2, 3, 6, 5, 4, 3, 3, 1, 1, 0, 1, 1, 1, 1],
    [1, 2, 5, 6, 2, 3, 3, 1, 1, 2, 1, 1, 1, 1],
    [2, 2, 9, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1],
]
# N C H W R S sh sw ph pw
POOL = [
    [2, 3, 6, 8, 2, 2, 2, 2, 0, 0],
    [2, 2, 7, 9, 2, 2, 2, 2, 0, 0],
    [2, 2, 7, 9, 3, 3, 2, 2, 1, 1],
    [1, 2, 5, 6, 3, 2, 1, 1, 0, 1],
    [3, 4, 5, 7, 5, 7, 1, 1, 0, 0],
]
BN = [[4, 3, 5], [2, 5, 21], [3, 2, 64]]
LN = [[5, 8], [3, 37], [2, 100]]
RMS = [[5, 8], [3, 37], [2, 300]]
# B T H Dh causal
ATTN = [[2, 5, 2, 8, 0], [2, 5, 2, 8, 1], [1, 1, 3, 4, 1], [1, 9, 1, 7, 1], [2, 70, 2, 6, 1],
        [1, 67, 3, 5, 0]]
# N V D
EMB = [[13, 5, 8], [40, 100, 37]]


def conv(x, w, sh, sw, ph, pw, dh, dw, g):
    n, c, h, wd = x.shape
    k, cg, r_, s_ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    p = (h + 2 * ph - dh * (r_ - 1) - 1) // sh + 1
    q = (wd + 2 * pw - dw * (s_ - 1) - 1) // sw + 1
    y = np.zeros((n, k, p, q))
    kg = k // g
    for kk in range(k):
        c0 = kk // kg * cg
        for r in range(r_):
            for s in range(s_):
                patch = xp[:, c0:c0 + cg, r * dh:r * dh + sh * (p - 1) + 1:sh,
                           s * dw:s * dw + sw * (q - 1) + 1:sw]
                y[:, kk] += np.einsum("ncpq,c->npq", patch, w[kk, :, r, s])
    return y


def pool(x, r_, s_, sh, sw, ph, pw, mode):
    n, c, h, wd = x.shape
    pad = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad)
    p = (h + 2 * ph - r_) // sh + 1
    q = (wd + 2 * pw - s_) // sw + 1
    win = np.stack([xp[:, :, r:r + sh * (p - 1) + 1:sh, s:s + sw * (q - 1) + 1:sw]
                    for r in range(r_) for s in range(s_)])
    return win.max(0) if mode == "max" else win.sum(0) / (r_ * s_)


def run(driver, table, op, dims, path):
    subprocess.run([driver, table, op] + [str(v) for v in dims] + [path], check=True)
    return np.fromfile(path, dtype=np.float32).astype(np.float64)


def take(buf, *shapes):
    out, at = [], 0
    for shp in shapes:
        size = int(np.prod(shp))
        out.append(buf[at:at + size].reshape(shp))
        at += size
    assert at == buf.size, "op_dump wrote %d values, expected %d" % (buf.size, at)
    return out


def check_conv(driver, table, d, path):
    n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw, g = d
    p = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
    q = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
    x, wt, y = take(run(driver, table, "conv", d, path), (n, c, h, w), (k, c // g, r, s),
                    (n, k, p, q))
    return [("y", y, conv(x, wt, sh, sw, ph, pw, dh, dw, g))]


def check_pool(driver, table, d, path):
    n, c, h, w, r, s, sh, sw, ph, pw = d
    p = (h + 2 * ph - r) // sh + 1
    q = (w + 2 * pw - s) // sw + 1
    x, ym, ya = take(run(driver, table, "pool", d, path), (n, c, h, w), (n, c, p, q),
                     (n, c, p, q))
    return [("max", ym, pool(x, r, s, sh, sw, ph, pw, "max")),
            ("avg", ya, pool(x, r, s, sh, sw, ph, pw, "avg"))]


def check_bn(driver, table, d, path):
    n, c, hw = d
    x, g, b, rm0, rv0, y, mean, invstd, rm, rv, yi = take(
        run(driver, table, "bn", d, path), (n, c, hw), (c,), (c,), (c,), (c,), (n, c, hw), (c,),
        (c,), (c,), (c,), (n, c, hw))
    m = x.mean(axis=(0, 2))
    var = x.var(axis=(0, 2))
    istd = 1.0 / np.sqrt(var + EPS)
    want_y = (x - m[None, :, None]) * (istd * g)[None, :, None] + b[None, :, None]
    cnt = n * hw
    want_rm = (1 - MOMENTUM) * rm0 + MOMENTUM * m
    want_rv = (1 - MOMENTUM) * rv0 + MOMENTUM * var * cnt / (cnt - 1)
    want_yi = ((x - rm[None, :, None]) / np.sqrt(rv[None, :, None] + EPS) * g[None, :, None]
               + b[None, :, None])
    return [("y", y, want_y), ("mean", mean, m), ("invstd", invstd, istd),
            ("running_mean", rm, want_rm), ("running_var", rv, want_rv), ("infer y", yi, want_yi)]


def check_ln(driver, table, d, path):
    rows, dd = d
    x, g, b, y, mean, rstd = take(run(driver, table, "ln", d, path), (rows, dd), (dd,), (dd,),
                                  (rows, dd), (rows,), (rows,))
    m = x.mean(axis=1)
    r = 1.0 / np.sqrt(x.var(axis=1) + EPS)
    return [("y", y, (x - m[:, None]) * r[:, None] * g + b), ("mean", mean, m), ("rstd", rstd, r)]


def check_rms(driver, table, d, path):
    rows, dd = d
    x, g, y, rstd = take(run(driver, table, "rms", d, path), (rows, dd), (dd,), (rows, dd),
                         (rows,))
    r = 1.0 / np.sqrt((x * x).mean(axis=1) + EPS)
    return [("y", y, x * r[:, None] * g), ("rstd", rstd, r)]


def attention(qkv, causal):
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, T, H, Dh) each
    t, dh = q.shape[1], q.shape[3]
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(dh)
    if causal:
        s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    e = np.exp(s - mx)
    lse = (mx + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]
    out = np.einsum("bhij,bjhd->bihd", e / e.sum(axis=-1, keepdims=True), v)
    return out, lse


def check_attn(driver, table, d, path):
    b, t, h, dh, causal = d
    qkv, out, lse = take(run(driver, table, "attn", d, path), (b, t, 3, h, dh), (b, t, h, dh),
                         (b, h, t))
    want_out, want_lse = attention(qkv, causal)
    return [("out", out, want_out), ("lse", lse, want_lse)]


def check_emb(driver, table, d, path):
    n, v, dd = d
    ids, w, out = take(run(driver, table, "emb", d, path), (n,), (v, dd), (n, dd))
    return [("out", out, w[ids.astype(np.int64)])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path = os.path.join(a.workdir, "op_dump.bin")
    bad = total = 0
    for table in ("ref", "fast"):
        for name, fn, cases in (("conv", check_conv, CONV), ("pool", check_pool, POOL),
                                ("batchnorm", check_bn, BN), ("layernorm", check_ln, LN),
                                ("attention", check_attn, ATTN), ("embedding", check_emb, EMB),
                                ("rmsnorm", check_rms, RMS)):
            for d in cases:
                for what, got, want in fn(a.driver, table, d, path):
                    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
                    total += 1
                    if not err <= TOL:
                        bad += 1
                        print("MISMATCH %s %s %s %s: max rel err %.3g" % (table, name, d, what, err))
    print("check_ops: %d of %d outputs agree with NumPy to %g" % (total - bad, total, TOL))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
