"""Writes tests/golden/requant/vectors.json: golden vectors of the integer-only (requantized) pipeline.

Run: python tests/golden/gen_requant.py

Independent of tessera and of torch on purpose: the formulas below are written out from the
gemmlowp / TFLite / CMSIS-NN sources' *text* in plain Python integers (arbitrary precision, so
nothing wraps by accident), with numpy only for the random inputs and the integer GEMM sums.

requantize (int32 acc, Q31 multiplier m, shift s in [-31, 30], TFLite convention: s > 0 shifts
left, s < 0 right):
  rounding="double" (gemmlowp / TFLite MultiplyByQuantizedMultiplier):
      a    = saturate_int32(acc * 2^max(s, 0))
      h    = SRDHM(a, m): INT32_MAX if a == m == INT32_MIN, else
             trunc((a*m + nudge) / 2^31) with nudge = 2^30 if a*m >= 0 else 1 - 2^30
             (truncating division: ties round up, i.e. away from zero only when positive)
      r    = RDBPOT(h, e = max(-s, 0)): (h >> e) + (rem > thr), rem = h & (2^e - 1),
             thr = (2^e - 1) >> 1, plus 1 when h < 0 (round half away from zero)
  rounding="single" (CMSIS-NN CMSIS_NN_USE_SINGLE_ROUNDING):
      r    = floor((acc*m + 2^(30 - s)) / 2^(31 - s))          (round half up)
int64 acc (the int16-activation path; TFLite's int64 MultiplyByQuantizedMultiplier), s in [-31, 7]:
      x    = clamp(acc, -2^47, 2^47 - 1)
      rm   = (m + 2^15) >> 16 if m < 0x7FFF0000 else 0x7FFF    (Q15 multiplier)
      r    = floor((x*rm + 2^(14 - s)) / 2^(15 - s))
then  out  = clamp(r + zero_point, qmin, qmax)  (computed exactly, then saturated).

linear_int8_requant / conv2d_int8 (TFLite quantized FC / conv, per-channel symmetric weights):
      acc[n] = sum_k (x[k] - x_zp) * w[n, k] + bias[n]     (padding taps contribute 0, i.e. they
                                                           hold x_zp before the subtraction)
      y      = requantize(acc, multiplier[n], shift[n], out_zp, qmin, qmax)
add_int8 (TFLite quantized ADD, per-tensor parameters, left shift L = 20 for int8, 15 for int16):
      ra     = mbqm_double((a - a_zp) * 2^L, a_mult, a_shift), rb likewise
      y      = clamp(mbqm_double(saturate_int32(ra + rb), out_mult, out_shift) + out_zp, qmin, qmax)
  parameters from float scales as TFLite's Prepare: twice = 2 max(s_a, s_b) (float64 of the
  float32 scales), reals s_a / twice, s_b / twice, twice / (2^L s_out), each through
  QuantizeMultiplier: frexp, round(q 2^31) half away from zero, q = 2^31 -> 2^30 and exponent + 1
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
I32_MIN, I32_MAX = -2**31, 2**31 - 1


def sat32(v):
    return max(I32_MIN, min(I32_MAX, v))


def srdhm(a, b):
    if a == I32_MIN and b == I32_MIN:
        return I32_MAX
    ab = a * b
    nudge = 2**30 if ab >= 0 else 1 - 2**30
    num = ab + nudge
    q = abs(num) // 2**31          # C division truncates toward zero
    return q if num >= 0 else -q


def rdbpot(x, e):
    mask = (1 << e) - 1
    rem = x & mask                 # Python's & on negatives is two's complement, as in C
    thr = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > thr else 0)


def mbqm_double(acc, m, s):
    a = sat32(acc * 2**max(s, 0))
    return rdbpot(srdhm(a, m), max(-s, 0))


def mbqm_single(acc, m, s):
    t = 31 - s
    return (acc * m + 2**(t - 1)) >> t   # >> on Python ints is floor division


def mbqm_int64(acc, m, s):
    x = max(-2**47, min(2**47 - 1, acc))
    rm = (m + 2**15) >> 16 if m < 0x7FFF0000 else 0x7FFF
    t = 15 - s
    return (x * rm + 2**(t - 1)) >> t


def requant(acc, mult, shift, zp, qmin, qmax, rounding):
    """acc: nested list [M][C]; mult/shift: length C (or 1)."""
    f = {"double": mbqm_double, "single": mbqm_single, "int64": mbqm_int64}[rounding]
    out = []
    for row in acc:
        r = []
        for c, v in enumerate(row):
            m = mult[c if len(mult) > 1 else 0]
            s = shift[c if len(shift) > 1 else 0]
            r.append(max(qmin, min(qmax, f(int(v), int(m), int(s)) + zp)))
        out.append(r)
    return out


def _acc_values(rng, C, n_rand):
    """Edge values, exact ties for shifts 1..8 of a 2^30 (= 0.5) multiplier, and random ones."""
    edge = [0, 1, -1, 2, -2, 3, -3, I32_MAX, I32_MIN, I32_MIN + 1, I32_MAX - 1, 2**30, -2**30,
            2**30 + 1, -(2**30 + 1), 127, -128, 255, -255]
    ties = [k * 2**e + 2**(e - 1) for e in range(1, 9) for k in (-3, -2, -1, 0, 1, 2)]
    vals = edge + ties + [int(v) for v in rng.integers(I32_MIN, I32_MAX, n_rand, endpoint=True)]
    vals += [int(v) for v in rng.integers(-2**20, 2**20, n_rand)]
    pad = (-len(vals)) % C
    vals += [int(v) for v in rng.integers(-5000, 5000, pad)]
    return [vals[i:i + C] for i in range(0, len(vals), C)]


def requant_vectors(rng):
    vecs = []
    mults = [2**31 - 1, 2**30, 2**30 + 1, 1, 1518500250, 1073741823, I32_MIN, -2**30]
    shifts = [0, -1, -2, -7, -8, -12, -31, 1, 5, 30]
    C = 8
    for rounding in ("double", "single"):
        for per_channel in (False, True):
            for (zp, qmin, qmax, odt) in ((0, -128, 127, "int8"), (-7, -128, 127, "int8"), (5, 5, 127, "int8"),
                                          (0, -32768, 32767, "int16"), (3, -1000, 900, "int16")):
                acc = _acc_values(rng, C, 24)
                if per_channel:
                    mult = [mults[c % len(mults)] for c in range(C)]
                    shift = [shifts[(c * 3) % len(shifts)] for c in range(C)]
                else:
                    k = len(vecs)
                    mult = [mults[k % len(mults)]]
                    shift = [shifts[k % len(shifts)]]
                if rounding == "single":   # CMSIS-NN's multipliers are non-negative
                    mult = [abs(m) if m != I32_MIN else I32_MAX for m in mult]
                vecs.append(dict(kind="requantize", rounding=rounding, acc_dtype="int32", acc=acc, multiplier=mult,
                                 shift=shift, zero_point=zp, qmin=qmin, qmax=qmax, out_dtype=odt,
                                 out=requant(acc, mult, shift, zp, qmin, qmax, rounding)))
    # every (multiplier, shift) pair of the extremes, per tensor, on the same edge values
    for m in mults:
        for s in shifts:
            acc = _acc_values(np.random.default_rng(abs(m) % 1000 + s + 40), C, 2)
            vecs.append(dict(kind="requantize", rounding="double", acc_dtype="int32", acc=acc, multiplier=[m],
                             shift=[s], zero_point=0, qmin=-32768, qmax=32767, out_dtype="int16",
                             out=requant(acc, [m], [s], 0, -32768, 32767, "double")))
    # int64 accumulators (int16 activations): the Q15 reduced multiplier, shifts -31..7
    for per_channel in (False, True):
        acc = [[int(v) for v in row] for row in rng.integers(-2**40, 2**40, (6, C))]
        acc += [[2**47 - 1, -2**47, 2**50, -2**50, 2**63 - 1, -2**63, 0, -1],
                [2**14, -2**14, 2**15 + 2**14, -(2**15 + 2**14), 3 * 2**13, -3 * 2**13, 1, 2**16]]
        mult = [2**31 - 1, 0x7FFF0000, 0x7FFEFFFF, 2**30, 1518500250, 1, 32768, 0] if per_channel else [1518500250]
        shift = [0, -1, -15, -31, 7, 1, -8, 3] if per_channel else [-10]
        vecs.append(dict(kind="requantize", rounding="single", acc_dtype="int64", acc=acc, multiplier=mult,
                         shift=shift, zero_point=0, qmin=-32768, qmax=32767, out_dtype="int16",
                         out=requant(acc, mult, shift, 0, -32768, 32767, "int64")))
    return vecs


def _mults(rng, n):
    """TFLite-style per-channel multipliers: m in [2^30, 2^31), shift in [-12, -5]."""
    return ([int(v) for v in rng.integers(2**30, 2**31 - 1, n)], [int(v) for v in rng.integers(-12, -4, n)])


def linear_vectors(rng):
    vecs = []
    for (M, K, N, xzp, ozp, qmin, qmax) in ((1, 7, 5, -3, 2, -128, 127), (5, 33, 9, 0, -128, -128, 127),
                                            (3, 130, 4, 17, -10, -10, 127), (2, 64, 3, -128, 0, -128, 127)):
        x = rng.integers(-128, 128, (M, K))
        if M == 2:          # extremes: every product at its largest
            x[:] = 127
        w = rng.integers(-127, 128, (N, K))
        bias = rng.integers(-2**16, 2**16, N)
        mult, shift = _mults(rng, N)
        acc = ((x - xzp) @ w.T + bias[None, :]).tolist()
        vecs.append(dict(kind="linear", x=x.tolist(), x_zero_point=xzp, weight=w.tolist(), bias=bias.tolist(),
                         multiplier=mult, shift=shift, out_zero_point=ozp, qmin=qmin, qmax=qmax,
                         out=requant(acc, mult, shift, ozp, qmin, qmax, "double")))
    return vecs


def conv_ref(x, xzp, w, bias, stride, padding, dilation, groups):
    """Direct convolution written out: x [N, C, H, W], w [O, C/g, kh, kw]; padding taps are x_zp."""
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    Ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    Wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.full((N, C, H + 2 * ph, W + 2 * pw), xzp, dtype=np.int64)
    xp[:, :, ph:ph + H, pw:pw + W] = x
    xp -= xzp
    out = np.zeros((N, O, Ho, Wo), dtype=np.int64)
    Og = O // groups
    for o in range(O):
        g = o // Og
        for i in range(Ho):
            for j in range(Wo):
                patch = xp[:, g * Cg:(g + 1) * Cg, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, o, i, j] = (patch * w[o][None]).reshape(N, -1).sum(1) + bias[o]
    return out


def conv_vectors(rng):
    vecs = []
    cases = [  # N, C, H, W, O, k, stride, padding, dilation, groups, x_dtype
        (1, 3, 7, 5, 4, 3, 1, 1, 1, 1, "int8"),
        (2, 4, 6, 6, 6, 3, 2, 0, 1, 2, "int8"),
        (1, 5, 9, 7, 5, 3, 1, 2, 2, 5, "int8"),
        (1, 8, 5, 5, 3, 1, 1, 0, 1, 1, "int8"),
        (1, 3, 7, 6, 4, 3, 1, 1, 1, 1, "int16"),
        (2, 4, 5, 5, 4, 2, 2, 1, 1, 4, "int16"),
    ]
    for (N, C, H, W, O, k, st, pd, dl, g, xdt) in cases:
        lo, hi = (-128, 128) if xdt == "int8" else (-32768, 32768)
        x = rng.integers(lo, hi, (N, C, H, W))
        xzp = int(rng.integers(-20, 20)) if xdt == "int8" else 0
        w = rng.integers(-127, 128, (O, C // g, k, k))
        if xdt == "int8":
            bias = rng.integers(-2**15, 2**15, O)
            mult, shift = _mults(rng, O)
            ozp, qmin, qmax, rounding = int(rng.integers(-10, 10)), -128, 127, "double"
        else:   # CMSIS-NN s16: int64 bias and accumulators, zero points 0, int16 output
            bias = rng.integers(-2**30, 2**30, O)
            mult = [int(v) for v in rng.integers(2**30, 2**31 - 1, O)]
            shift = [int(v) for v in rng.integers(-20, -10, O)]
            ozp, qmin, qmax, rounding = 0, -32768, 32767, "int64"
        acc = conv_ref(x, xzp, w, bias, (st, st), (pd, pd), (dl, dl), g)
        acc_rows = acc.transpose(0, 2, 3, 1).reshape(-1, O).tolist()
        y = np.array(requant(acc_rows, mult, shift, ozp, qmin, qmax, rounding))
        Ho, Wo = acc.shape[2], acc.shape[3]
        y = y.reshape(N, Ho, Wo, O).transpose(0, 3, 1, 2)
        vecs.append(dict(kind="conv2d", x_dtype=xdt, x=x.tolist(), x_zero_point=xzp, weight=w.tolist(),
                         bias=bias.tolist(), multiplier=mult, shift=shift, out_zero_point=ozp, qmin=qmin,
                         qmax=qmax, stride=st, padding=pd, dilation=dl, groups=g, out=y.tolist()))
    return vecs


def quantize_multiplier(real):
    """TFLite QuantizeMultiplier: real = q * 2^(shift - 31), q in [2^30, 2^31)."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = math.floor(q * 2**31 + 0.5)        # TfLiteRound: half away from zero (q > 0 here)
    if q_fixed == 2**31:
        q_fixed, shift = q_fixed // 2, shift + 1
    if shift < -31:
        q_fixed, shift = 0, 0
    return int(q_fixed), int(shift)


def add_params(sa, sb, so, left):
    twice = 2.0 * max(sa, sb)
    ma, sha = quantize_multiplier(sa / twice)
    mb, shb = quantize_multiplier(sb / twice)
    mo, sho = quantize_multiplier(twice / (2**left * so))
    return dict(a_multiplier=ma, a_shift=sha, b_multiplier=mb, b_shift=shb, out_multiplier=mo, out_shift=sho)


def add_ref(a, b, p):
    L = p["left_shift"]
    out = []
    for x, y in zip(a, b):
        ra = mbqm_double((x - p["a_zero_point"]) * 2**L, p["a_multiplier"], p["a_shift"])
        rb = mbqm_double((y - p["b_zero_point"]) * 2**L, p["b_multiplier"], p["b_shift"])
        r = mbqm_double(sat32(ra + rb), p["out_multiplier"], p["out_shift"])
        out.append(max(p["qmin"], min(p["qmax"], r + p["out_zero_point"])))
    return out


def add_vectors(rng):
    vecs = []
    f32 = lambda v: float(np.float32(v))   # noqa: E731  (scales are float32 in a TFLite model)
    for dt, L, n in (("int8", 20, 1024), ("int8", 20, 97), ("int8", 20, 301), ("int16", 15, 257), ("int16", 15, 64)):
        lo, hi = (-128, 127) if dt == "int8" else (-32768, 32767)
        if n == 1024:     # every code of a, four times, against random b
            a = [v for _ in range(4) for v in range(lo, hi + 1)]
        else:
            a = [int(v) for v in rng.integers(lo, hi + 1, n)]
            a[:2] = [lo, hi]
        b = [int(v) for v in rng.integers(lo, hi + 1, len(a))]
        b[:2] = [lo, hi]
        sa, sb = f32(rng.uniform(0.005, 0.2)), f32(rng.uniform(0.005, 0.2))
        so = f32((sa + sb) * rng.uniform(0.6, 1.5))
        zps = [int(v) for v in rng.integers(-60, 60, 3)] if dt == "int8" else [0, 0, 0]
        p = dict(a_zero_point=zps[0], b_zero_point=zps[1], out_zero_point=zps[2], left_shift=L, qmin=lo, qmax=hi)
        if n == 301:      # a fused ReLU: the clamp starts at the output zero point
            p["qmin"] = zps[2]
        p.update(add_params(sa, sb, so, L))
        vecs.append(dict(dtype=dt, scales=[sa, sb, so], a=a, b=b, out=add_ref(a, b, p), **p))
    # ties (L = 0, multipliers 0.5, shift -1: each input x / 4 rounded twice), then the extremes:
    # the largest / negative multipliers, left shifts in the MBQM, a saturating int32 sum
    xs = list(range(-128, 128, 3))
    ys = [((7 * i) % 256) - 128 for i in range(len(xs))]
    for (ma, sa_, mb, sb_, mo, so_, L) in ((2**30, -1, 2**30, -1, 2**30, -1, 0),
                                           (2**31 - 1, 0, -2**31, 0, 2**31 - 1, -16, 20),
                                           (2**31 - 1, 2, 2**31 - 1, 3, 2**30, -3, 23),
                                           (1, -31, 1518500250, -5, 1073741823, 0, 8)):
        p = dict(a_zero_point=-7, b_zero_point=5, out_zero_point=3, left_shift=L, qmin=-128, qmax=127,
                 a_multiplier=ma, a_shift=sa_, b_multiplier=mb, b_shift=sb_, out_multiplier=mo, out_shift=so_)
        vecs.append(dict(dtype="int8", scales=None, a=xs, b=ys, out=add_ref(xs, ys, p), **p))
    return vecs


def main():
    rng = np.random.default_rng(20261204)
    data = {"note": __doc__.split("\n\n", 1)[1], "requantize": requant_vectors(rng),
            "linear": linear_vectors(rng), "conv2d": conv_vectors(rng),
            "add": add_vectors(rng)}
    (HERE / "requant" / "vectors.json").write_text(json.dumps(data, separators=(",", ":")))


if __name__ == "__main__":
    main()
