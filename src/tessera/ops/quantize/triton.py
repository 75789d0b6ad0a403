"""quantize_blocks Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

Two launches: ``_stats_kernel`` (one program per scale block: statistics over the block's
rows and columns in tiles, then the scale / zero point) and ``_codes_kernel`` (tiles of
codes, each element reading its block's scale).  The integer contract of ref.py is followed
bit for bit: ``tl.math.div_rn`` (IEEE division; ``/`` is approximate on GPUs), NaN -> 0,
saturation before rounding, round half to even with the interpreter-safe ``rint`` helper,
fp8 encoded with integer ops into a uint8 view of the output (the interpreter cannot store
fp8).  For q4_0 ("first entry of largest |x|") tiles are visited left to right within a row
(block_rows is 1), the smallest index wins inside a tile and a later tile only with a
strictly larger magnitude.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2
from ...backends.triton_lang import fp8_e4m3_bits, fp8_e5m2_bits, rint
from .cpu import KIND as _KIND
from .ref import QTYPES, grid

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
I8, I16, I4, I4ZP, Q40, E4M3, E5M2, FNUZ = 0, 1, 2, 3, 4, 5, 6, 7
QMAX = {I8: 127.0, I16: 32767.0, I4: 7.0, I4ZP: 15.0, Q40: 7.0, E4M3: 448.0, E5M2: 57344.0, FNUZ: 240.0}


@triton.jit
def _e4m3fnuz_bits(q):
    """fp32 (|q| <= 240, not NaN) -> AMD float8_e4m3fnuz bits (bias 8, RNE, subnormals of 2^-10;
    no negative zero: 0x80 is the NaN), the construction of triton_lang.fp8_e4m3_bits."""
    a = tl.abs(q)
    u = a.to(tl.int32, bitcast=True)
    r = u + 0x7FFFF + ((u >> 20) & 1)
    normal = (((r >> 23) - 119) << 3) | ((r >> 20) & 7)
    sub = ((a * 1024.0 + 12582912.0) - 12582912.0).to(tl.int32)
    code = tl.where(a < 0.0078125, sub, normal)
    return code | tl.where((code != 0) & (q < 0.0), 0x80, 0)


@triton.jit
def _stats_kernel(x_ptr, ldx, s_ptr, z_ptr, M, K, br, bc, Kb,
                  KIND: tl.constexpr, QMAXV: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr,
                  HW_RINT: tl.constexpr):
    bi = tl.program_id(0).to(tl.int64)
    kb = tl.program_id(1).to(tl.int64)
    r0 = bi * br
    r1 = tl.minimum(r0 + br, M)
    c0 = kb * bc
    c1 = tl.minimum(c0 + bc, K)
    ri = tl.arange(0, RB).to(tl.int64)
    ci = tl.arange(0, CB).to(tl.int64)
    a = tl.full((), 0.0, tl.float32)
    b = tl.full((), 0.0, tl.float32)
    for r in range(r0, r1, RB):
        for c in range(c0, c1, CB):
            rows = r + ri
            cols = c + ci
            m = (rows[:, None] < r1) & (cols[None, :] < c1)
            v = tl.load(x_ptr + rows[:, None] * ldx + cols[None, :], mask=m, other=0.0).to(tl.float32)
            v = tl.where(v != v, 0.0, v)
            if KIND == 3:
                a = tl.minimum(a, tl.min(v))
                b = tl.maximum(b, tl.max(v))
            elif KIND == 4:
                av = tl.abs(v)
                ca = tl.max(av)
                lin = rows[:, None] * K + cols[None, :]
                first = tl.min(tl.where(av == ca, lin, 9223372036854775807))
                cm = tl.sum(tl.where(lin == first, v, 0.0))
                take = ca > a
                b = tl.where(take, cm, b)
                a = tl.where(take, ca, a)
            else:
                a = tl.maximum(a, tl.max(tl.abs(v)))
    if KIND == 3:
        s = tl.math.div_rn(tl.maximum(b - a, 1e-12), tl.full((), 15.0, tl.float32))
        zq = tl.math.div_rn(-a, s)
        zq = tl.minimum(tl.maximum(tl.where(zq != zq, 0.0, zq), 0.0), 15.0)
        tl.store(z_ptr + bi * Kb + kb, rint(zq, HW_RINT).to(tl.uint8))
    elif KIND == 4:
        ma = tl.maximum(a, 1e-12)
        s = tl.math.div_rn(tl.where(b < 0.0, -ma, ma), tl.full((), -8.0, tl.float32))
    else:
        s = tl.math.div_rn(tl.maximum(a, 1e-12), tl.full((), QMAXV, tl.float32))
    tl.store(s_ptr + bi * Kb + kb, s)


@triton.jit
def _code(x_ptr, ldx, s_ptr, z_ptr, rows, cols, m, br, bc, Kb,
          KIND: tl.constexpr, QMAXV: tl.constexpr, HW_RINT: tl.constexpr):
    """int32 code of x[rows, cols] (fp8: the bit pattern; 4-bit: 0..15)."""
    v = tl.load(x_ptr + rows[:, None] * ldx + cols[None, :], mask=m, other=0.0).to(tl.float32)
    sidx = (rows[:, None] // br) * Kb + cols[None, :] // bc
    s = tl.load(s_ptr + sidx, mask=m, other=1.0)
    q = tl.math.div_rn(v, s)
    q = tl.where(q != q, 0.0, q)
    if KIND == 5:
        c = fp8_e4m3_bits(tl.minimum(tl.maximum(q, -448.0), 448.0))
    elif KIND == 6:
        c = fp8_e5m2_bits(tl.minimum(tl.maximum(q, -57344.0), 57344.0))
    elif KIND == 7:
        c = _e4m3fnuz_bits(tl.minimum(tl.maximum(q, -240.0), 240.0))
    elif KIND == 3:
        z = tl.load(z_ptr + sidx, mask=m, other=0).to(tl.float32)
        q = tl.minimum(tl.maximum(q, -z), 15.0 - z)
        c = (rint(q, HW_RINT) + z).to(tl.int32)
    elif KIND == 2 or KIND == 4:
        q = tl.minimum(tl.maximum(q, -8.0), 7.0)
        c = rint(q, HW_RINT).to(tl.int32) + 8
    else:
        q = tl.minimum(tl.maximum(q, -QMAXV), QMAXV)
        c = rint(q, HW_RINT).to(tl.int32)
    return c


@triton.jit
def _codes_kernel(x_ptr, ldx, q_ptr, ldq, s_ptr, z_ptr, M, K, br, bc, Kb,
                  KIND: tl.constexpr, QMAXV: tl.constexpr, PACKED: tl.constexpr, RB: tl.constexpr,
                  CB: tl.constexpr, HW_RINT: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * RB + tl.arange(0, RB).to(tl.int64)
    jj = tl.program_id(1).to(tl.int64) * CB + tl.arange(0, CB).to(tl.int64)
    dst = q_ptr + rows[:, None] * ldq + jj[None, :]
    if PACKED:
        m = (rows[:, None] < M) & (jj[None, :] < K // 2)
        lo = _code(x_ptr, ldx, s_ptr, z_ptr, rows, 2 * jj, m, br, bc, Kb, KIND, QMAXV, HW_RINT)
        hi = _code(x_ptr, ldx, s_ptr, z_ptr, rows, 2 * jj + 1, m, br, bc, Kb, KIND, QMAXV, HW_RINT)
        tl.store(dst, (lo | (hi << 4)).to(tl.uint8), mask=m)
    else:
        m = (rows[:, None] < M) & (jj[None, :] < K)
        c = _code(x_ptr, ldx, s_ptr, z_ptr, rows, jj, m, br, bc, Kb, KIND, QMAXV, HW_RINT)
        tl.store(dst, c.to(q_ptr.dtype.element_ty), mask=m)


def tiles(M: int, n: int) -> tuple[int, int]:
    """(rows, columns) per program: few large programs under the interpreter."""
    cb = min(next_pow2(max(n, 1)), 1024)
    budget = 8192 if interpreted() else 2048
    return max(1, min(next_pow2(max(M, 1)), budget // cb)), cb


def forward(x, qtype, block_rows, block):
    M, K = x.shape
    br, bc, Mb, Kb = grid(M, K, block_rows, block)
    dt, _, packed = QTYPES[qtype]
    kind = _KIND[qtype]
    codes = new_output((M, K // 2 if packed else K), dt, x.device)
    scale = new_output((Mb, Kb), torch.float32, x.device)
    zero = new_output((Mb, Kb), torch.uint8, x.device) if qtype == "int4_zp" else None
    hw = not interpreted()
    if Mb * Kb:
        rb, cb = tiles(1 if kind == Q40 else min(br, max(M, 1)), min(bc, K))
        _stats_kernel[(Mb, Kb)](x, x.stride(0), scale, scale if zero is None else zero, M, K, br, bc, Kb,
                                KIND=kind, QMAXV=QMAX[kind], RB=rb, CB=cb, HW_RINT=hw)
    if M:
        n = K // 2 if packed else K
        rb, cb = tiles(M, n)
        out = codes.view(torch.uint8) if dt.is_floating_point else codes
        _codes_kernel[(triton.cdiv(M, rb), triton.cdiv(n, cb))](
            x, x.stride(0), out, n, scale, scale if zero is None else zero, M, K, br, bc, Kb,
            KIND=kind, QMAXV=QMAX[kind], PACKED=packed, RB=rb, CB=cb, HW_RINT=hw)
    return codes, scale, zero


def backward(*args):
    raise NotImplementedError("quantize_blocks has no gradient")
