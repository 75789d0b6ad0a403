"""Writes the golden vectors of tests/golden/*.json (run: python tests/golden/make_golden.py).

Independent of tessera and torch on purpose: numpy float32 scalar arithmetic (IEEE, correctly
rounded division, np.rint = round half to even) and ml_dtypes' fp8 casts (round to nearest
even) restate the integer contract of tessera/quant/contract.py from its text.  The inputs are
hand-picked: exact .5 ties after the division, zero rows, NaN, +-inf, 1e4 outliers, fp8
midpoints and subnormals.  Each file: {"format", "shape", "input" (floats; "nan"/"inf"/"-inf"
as strings), "codes" (ints, unpacked: 4-bit codes 0..15; fp8 as bit patterns), "packed_hex"
(the data bytes of 4-bit formats), "scale_hex" (fp32 bits, or fp16 bits for ggml),
"scale" (decimal, for reading), "zero", "dequant_hex" (fp32 bits), "ggml_hex" (block bytes)}.
"""
from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

F = np.float32
EPS = F(1e-12)
HERE = Path(__file__).parent
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz}


def f32hex(a):
    return [f"{int(v):08x}" for v in np.asarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


def jnum(v):
    v = float(v)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def blocks(M, K, br, bc):
    br = M if br == 0 else br
    bc = K if bc == 0 else bc
    return br, bc, -(-M // br), -(-K // bc)


def nan0(a):
    return np.where(np.isnan(a), F(0), a).astype(F)


def quant(x, kind, br, bc):
    """-> codes (int64 [M, K]), scale f32 [Mb, Kb], zero [Mb, Kb] or None."""
    M, K = x.shape
    br, bc, Mb, Kb = blocks(M, K, br, bc)
    scale = np.zeros((Mb, Kb), F)
    zero = np.zeros((Mb, Kb), np.int64)
    codes = np.zeros((M, K), np.int64)
    qmax = {"int8": F(127), "int16": F(32767), "int4": F(7), "e4m3": F(448), "e5m2": F(57344), "e4m3fnuz": F(240)}
    for bi in range(Mb):
        for kb in range(Kb):
            blk = nan0(x[bi * br:(bi + 1) * br, kb * bc:(kb + 1) * bc])
            if kind == "int4_zp":
                lo, hi = min(F(blk.min()), F(0)), max(F(blk.max()), F(0))
                s = F(max(F(hi - lo), EPS) / F(15))
                z = -lo / s
                zero[bi, kb] = int(np.clip(np.rint(0.0 if np.isnan(z) else z), 0, 15))
            elif kind == "q4_0":
                flat = blk.reshape(-1)
                m = flat[int(np.argmax(np.abs(flat)))]       # first occurrence
                ma = max(F(abs(m)), EPS)
                s = F(F(-ma if m < 0 else ma) / F(-8))
            else:
                s = F(max(F(np.abs(blk).max()), EPS) / qmax[kind])
            scale[bi, kb] = s
    for i in range(M):
        for j in range(K):
            s = scale[i // br, j // bc]
            with np.errstate(invalid="ignore"):
                q = F(F(x[i, j]) / s)
            q = F(0) if np.isnan(q) else q
            if kind in FP8:
                m = qmax[kind]
                dt = FP8[kind]
                codes[i, j] = int(np.array([np.clip(q, -m, m)], F).astype(dt).view(np.uint8)[0])
            elif kind == "int4_zp":
                z = zero[i // br, j // bc]
                codes[i, j] = int(np.clip(np.rint(q) + z, 0, 15))
            elif kind in ("int4", "q4_0"):
                codes[i, j] = int(np.clip(np.rint(q), -8, 7)) + 8
            else:
                m = qmax[kind]
                codes[i, j] = int(np.clip(np.rint(q), -m, m))
    return codes, scale, (zero if kind == "int4_zp" else None)


def dequant(codes, scale, zero, kind, br, bc):
    M, K = codes.shape
    br, bc, _, _ = blocks(M, K, br, bc)
    out = np.zeros((M, K), F)
    for i in range(M):
        for j in range(K):
            s = F(scale[i // br, j // bc])
            c = codes[i, j]
            if kind in FP8:
                v = F(np.array([c], np.uint8).view(FP8[kind]).astype(F)[0])
            elif kind == "int4_zp":
                v = F(c - int(zero[i // br, j // bc]))
            elif kind in ("int4", "q4_0"):
                v = F(c - 8)
            else:
                v = F(c)
            with np.errstate(invalid="ignore"):
                out[i, j] = F(v * s)
    return out


# ---------------------------------------------------------------- hand-picked inputs

def tie_row(K, top):
    """(n + 1/2) / 8 for n = -7..6 cycling, with the block maximum top / 8 at the end: scale is
    exactly 1/8 when top = QMAX, so x / scale = n + 1/2 exactly (rint: 2.5 -> 2, -2.5 -> -2, 3.5 -> 4)."""
    r = np.array([((j % 14) - 7 + 0.5) / 8 for j in range(K)], F)
    r[-1] = F(top / 8)
    return r


def mixed_row(K, seed):
    g = np.random.default_rng(seed)
    return np.round(g.standard_normal(K) * 4) / 4          # quarters: exact, short decimals


def rows_input(qmax, K=16, inf=True):
    x = np.stack([tie_row(K, qmax), np.zeros(K), mixed_row(K, 1), mixed_row(K, 2)]).astype(F)
    x[2, 3], x[2, 5], x[3, 0] = np.nan, 1e4, -1e4
    if inf:
        x[3, 7] = np.inf
    return x


def group_input(K, group, qmax, zp=False):
    rows = []
    for r in range(2):
        v = mixed_row(K, 10 + r)
        for g0 in range(0, K, group):
            t = tie_row(group, qmax if not zp else 7.0)
            if zp:
                t[-2] = F(-1.0)           # range [-1, 0.875]: scale 1/8 exactly, zero 8
            if r == 0:
                v[g0:g0 + group] = t
        rows.append(v)
    x = np.stack(rows).astype(F)
    x[1, 1], x[1, 2] = np.nan, 1e4
    x[1, group:2 * group] = 0 if K >= 2 * group else x[1, group:2 * group]
    return x


def fp8_input(kind, M=3, K=16):
    """Row 0: midpoints between neighbouring fp8 values (normal and subnormal) at scale 1/8."""
    mant = 2 if kind == "e5m2" else 3
    qmax = {"e4m3": 448.0, "e5m2": 57344.0, "e4m3fnuz": 240.0}[kind]
    sub = 2.0 ** {"e4m3": -9, "e5m2": -16, "e4m3fnuz": -10}[kind]
    r0 = []
    for j in range(K - 1):
        if j % 4 == 3:
            r0.append((j // 4 * 2 + 1) * sub / 2)                # halfway between subnormals
        else:
            r0.append((1 + (2 * (j % (1 << mant)) + 1) / (2 << mant)) * 2.0 ** (j % 5 - 2))
    r0 = [v / 8 for v in r0] + [qmax / 8]
    x = np.stack([np.array(r0), mixed_row(K, 5), mixed_row(K, 6)]).astype(F)[:M]
    x[1, 2], x[2, 4] = np.nan, -1e4
    return x


def ggml_bytes(codes, scale, ggml) -> bytes:
    """ggml block bytes: per 32 values the fp16 d, then Q4_0 byte j = q[j] | q[j + 16] << 4
    (codes offset binary) or Q8_0's 32 int8 codes."""
    d16 = scale.astype(np.float16)
    M, K = codes.shape
    out = bytearray()
    for i in range(M):
        for b in range(K // 32):
            q = codes[i, b * 32:(b + 1) * 32]
            out += d16[i, b].tobytes()
            out += bytes(int(q[j] | (q[j + 16] << 4)) for j in range(16)) if ggml == "q4_0" \
                else q.astype(np.int8).tobytes()
    return bytes(out)


def write(name, fmt, x, kind, br, bc, packed=False, ggml=None, note=""):
    codes, scale, zero = quant(x, kind, br, bc)
    deq = dequant(codes, scale, zero, kind, br, bc)
    doc = {"format": fmt, "note": note, "shape": list(x.shape), "input": [jnum(v) for v in x.reshape(-1)],
           "codes": [int(c) for c in codes.reshape(-1)]}
    if packed:
        p = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        doc["packed_hex"] = p.tobytes().hex()
    if ggml:
        d16 = scale.astype(np.float16)
        doc["scale_hex"] = [f"{int(v):04x}" for v in d16.reshape(-1).view(np.uint16)]
        doc["scale"] = [jnum(v) for v in d16.reshape(-1)]
        doc["ggml_hex"] = ggml_bytes(codes, scale, ggml).hex()
        # dequantisation uses the stored fp16 scale
        deq = dequant(codes, d16.astype(F), None, kind, br, bc)
    else:
        doc["scale_hex"] = f32hex(scale)
        doc["scale"] = [jnum(v) for v in scale.reshape(-1)]
    doc["zero"] = None if zero is None else [int(z) for z in zero.reshape(-1)]
    doc["dequant_hex"] = f32hex(deq)
    (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")


def main():
    for bits, q in (("int8", 127.0), ("int16", 32767.0)):
        write(f"{bits}-token", f"{bits}-token", rows_input(q), bits, 1, 0,
              note="row 0: x/scale = n + 1/2 exactly; row 1 zeros; NaN -> 0; a row with inf: scale inf, codes 0")
        write(f"{bits}-tensor", f"{bits}-tensor", rows_input(q, inf=False), bits, 0, 0, note="one scale: the 1e4 outlier")
    write("int8-channel", "int8-channel", rows_input(127.0), "int8", 1, 0, note="weight [N, K]: one scale per row")
    for g in (32, 64, 128):
        K = 2 * g if g < 128 else 128
        write(f"int4-g{g}", f"int4-g{g}", group_input(K, g, 7.0), "int4", 1, g, packed=True,
              note="row 0: ties in every group (scale 1/8); codes offset binary q + 8")
        write(f"int4-g{g}-zp", f"int4-g{g}-zp", group_input(K, g, 7.0, zp=True), "int4_zp", 1, g, packed=True,
              note="row 0 groups span [-1, 0.875]: scale 1/8, zero 8, ties")
    for kind in ("e4m3", "e5m2", "e4m3fnuz"):
        write(f"fp8-{kind}-row", f"fp8-{kind}-row", fp8_input(kind), kind, 1, 0,
              note="row 0: midpoints between fp8 neighbours at scale 1/8 (RNE picks the even code)")
        write(f"fp8-{kind}-tensor", f"fp8-{kind}-tensor", fp8_input(kind), kind, 0, 0)
        x = np.stack([mixed_row(130, 20 + r) for r in range(2)]).astype(F)
        x[0, 129], x[1, 3] = 1e4, np.nan
        write(f"fp8-{kind}-block128", f"fp8-{kind}-block128", x, kind, 128, 128,
              note="2 x 130: blocks [0:128) and [128:130) of columns, both rows in block row 0")
    x = group_input(64, 32, 7.0, zp=True)
    x[1, 40] = -3.5                                   # negative max magnitude -> positive d
    write("q4_0", "q4_0", x, "q4_0", 1, 32, packed=True, ggml="q4_0",
          note="d = m / -8 (m: first value of largest |x|), stored fp16; ggml block bytes in ggml_hex")
    write("q8_0", "q8_0", group_input(64, 32, 127.0), "int8", 1, 32, ggml="q8_0",
          note="d = amax / 127, stored fp16; codes from the fp32 d")
    gguf_expected()


def gguf_expected():
    """tests/golden/gguf/*.json hold bytes written by gguf-py (``ggml_hex``, not regenerated
    here: gguf-py is not a dependency).  Beside them this writes ``expected_hex``: the bytes of
    tessera's documented rule (the contract above: x / d correctly rounded, half to even) for the
    same input, from numpy, and ``differing_bytes``: where the two differ.  The test checks that
    tessera writes ``expected_hex`` and that every differing byte holds an exact .5 tie."""
    for fmt, kind in (("q4_0", "q4_0"), ("q8_0", "int8")):
        path = HERE / "gguf" / f"{fmt}.json"
        doc = json.loads(path.read_text())
        x = np.array([float(v) for v in doc["input"]], F).reshape(doc["shape"])
        codes, scale, _ = quant(x, kind, 1, 32)
        ours, theirs = ggml_bytes(codes, scale, fmt), bytes.fromhex(doc["ggml_hex"])
        doc.pop("tessera_hex", None)
        doc["expected_hex"] = ours.hex()
        doc["differing_bytes"] = [i for i in range(len(ours)) if ours[i] != theirs[i]]
        doc["note"] = doc["note"].split(" tessera_hex:")[0].split(" expected_hex:")[0] + (
            " expected_hex: the bytes of tessera's rule (round half to even of the correctly rounded"
            " x / d), computed in numpy by tests/golden/make_golden.py (independent of tessera);"
            " differing_bytes: where they differ from ggml_hex (exact .5 ties only: ggml rounds"
            " half up / away from zero).")
        path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
