"""append_kv Triton kernel (GPU; CPU tensors under TRITON_INTERPRET=1).

One program per (sequence, new token) writes all Hk x D values of that token.  Quantised
caches follow the integer contract of ref.py bit for bit: ``tl.math.div_rn`` (IEEE division;
``/`` is approximate on GPUs), round half to even, saturation, NaN -> 0.  Rounding to an
integer uses libdevice ``rint`` on GPUs and, under the interpreter (which lacks libdevice),
the exact equivalent ``(q + 1.5 * 2^23) - 1.5 * 2^23`` (valid for |q| <= 2^22; q is clamped
to [-127, 127] first).  float8_e4m3fn is encoded with integer ops into a uint8 view of the
cache (round to nearest even, subnormals included), so no fp8 loads/stores are needed:
the interpreter cannot load fp8 with ``other=``.  Narrowing to a bf16 cache is also done with
integer ops (round to nearest even): the interpreter's own fp32 -> bf16 cast is not RNE.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends.triton import interpreted, next_pow2
from ...backends.triton_lang import fp8_e4m3_bits, rint as _rint
from .ref import CACHE_DTYPES  # noqa: F401  (all of them: fp8 goes through uint8)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KIND = {torch.int8: 1, torch.float8_e4m3fn: 2}


@triton.jit
def _append_kernel(x_ptr, c_ptr, s_ptr, bt_ptr, pos_ptr, n_new, MB, P,
                   HK: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                   KIND: tl.constexpr, QMAX: tl.constexpr, HW_RINT: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    t = tl.load(pos_ptr + b).to(tl.int64) + i
    page = tl.load(bt_ptr + b * MB + t // P).to(tl.int64)
    row = page * P + t % P
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    m = (h[:, None] < HK) & (d[None, :] < D)
    off = h[:, None] * D + d[None, :]
    x = tl.load(x_ptr + (b * n_new + i) * (HK * D) + off, mask=m, other=0.0).to(tl.float32)
    dst = c_ptr + row * (HK * D) + off
    if KIND == 0:
        tl.store(dst, x.to(c_ptr.dtype.element_ty), mask=m)
    elif KIND == 3:  # bf16 bits, round to nearest even (NaN -> 0x7fc0, as torch)
        u = x.to(tl.int32, bitcast=True)
        r = tl.where(x != x, 0x7FC0, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
        tl.store(dst, r.to(tl.int16), mask=m)
    else:
        isnan = x != x
        amax = tl.max(tl.where(isnan, 0.0, tl.abs(x)), axis=1)
        scale = tl.math.div_rn(tl.maximum(amax, 1e-12), tl.full(amax.shape, QMAX, tl.float32))
        q = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
        q = tl.where(q != q, 0.0, q)
        q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
        if KIND == 1:
            tl.store(dst, _rint(q, HW_RINT).to(tl.int8), mask=m)
        else:
            tl.store(dst, fp8_e4m3_bits(q).to(tl.uint8), mask=m)
        tl.store(s_ptr + row * HK + h, scale, mask=h < HK)


def forward(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale):
    B, n, Hk, D = k.shape
    kind = _KIND.get(k_cache.dtype, 0)
    if k_cache.dtype == torch.bfloat16 and k.dtype != torch.bfloat16:
        kind = 3
    for x, c, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        cv = c.view(torch.uint8) if kind == 2 else (c.view(torch.int16) if kind == 3 else c)
        _append_kernel[(B, n)](x, cv, c if s is None else s, block_table, positions, n, block_table.shape[1],
                               k_cache.shape[1], HK=Hk, D=D, BLOCK_H=next_pow2(Hk), BLOCK_D=next_pow2(D),
                               KIND=kind, QMAX=448.0 if kind == 2 else 127.0, HW_RINT=not interpreted())


def backward(*args):
    raise NotImplementedError("append_kv has no gradient (inference only)")
