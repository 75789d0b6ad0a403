"""add_int8 Triton kernel (GPU; CPU tensors under TRITON_INTERPRET=1): one program per BLOCK
elements of the flat operands, the three MultiplyByQuantizedMultiplier steps in int64 with
ops/_requant/triton.py's ``_mbqm`` (the same branch-free formulas as requant.c)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted
from .._requant.triton import _mbqm
from .ref import DTYPES  # noqa: F401


@triton.jit
def _add_kernel(a_ptr, b_ptr, out_ptr, n, za, ma, sa, zb, mb, sb, mo, so, zo, qmin, qmax, left,
                BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    z = tl.zeros([BLOCK], tl.int64)
    xa = (tl.load(a_ptr + i, mask=ok, other=0).to(tl.int64) - za) << left   # |.| < 2^31 (checked)
    xb = (tl.load(b_ptr + i, mask=ok, other=0).to(tl.int64) - zb) << left
    ra = _mbqm(xa, z + ma, z + sa, 0)
    rb = _mbqm(xb, z + mb, z + sb, 0)
    raw = tl.minimum(tl.maximum(ra + rb, -2147483648), 2147483647)   # TFLite's int32 sum, saturated
    r = _mbqm(raw, z + mo, z + so, 0)
    y = tl.minimum(tl.maximum(r + zo, qmin), qmax)
    tl.store(out_ptr + i, y.to(out_ptr.dtype.element_ty), mask=ok)


def forward(a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
            out_shift, out_zero_point, qmin, qmax, left_shift):
    n = a.numel()
    out = new_output((n,), a.dtype, a.device)
    if n:
        BLOCK = 4096 if interpreted() else 1024
        _add_kernel[(triton.cdiv(n, BLOCK),)](a, b, out, n, a_zero_point, a_multiplier, a_shift, b_zero_point,
                                              b_multiplier, b_shift, out_multiplier, out_shift, out_zero_point,
                                              qmin, qmax, left_shift, BLOCK=BLOCK)
    return out


def backward(*args):
    raise NotImplementedError("add_int8 has no gradient (integer op)")
