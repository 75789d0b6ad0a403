"""max_pool2d_int8 Triton kernel (GPU; CPU tensors under TRITON_INTERPRET=1): one program per
BLOCK output elements (logical NCHW order, any strides in and out), the taps unrolled; masked
loads give taps outside x the dtype's minimum, which never wins (every window has a tap inside)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends.triton import interpreted
from . import output

DTYPES = (torch.int8, torch.int16)


@triton.jit
def _pool_kernel(x_ptr, sn, sc, sh, sw, y_ptr, yn, yc, yh, yw, total, C, H, W, Ho, Wo, st_h, st_w, pd_h, pd_w,
                 dl_h, dl_w, lowest, KH: tl.constexpr, KW: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    ox = i % Wo
    oy = (i // Wo) % Ho
    c = (i // (Wo * Ho)) % C
    n = i // (Wo * Ho * C)
    m = tl.full([BLOCK], lowest, tl.int32)
    for ky in tl.static_range(KH):
        iy = oy * st_h - pd_h + ky * dl_h
        for kx in tl.static_range(KW):
            ix = ox * st_w - pd_w + kx * dl_w
            inb = ok & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
            v = tl.load(x_ptr + n * sn + c * sc + iy * sh + ix * sw, mask=inb, other=lowest).to(tl.int32)
            m = tl.maximum(m, v)
    tl.store(y_ptr + n * yn + c * yc + oy * yh + ox * yw, m.to(y_ptr.dtype.element_ty), mask=ok)


def forward(x, k, s, p, d, ceil_mode, Ho, Wo, channels_last):
    y = output(x, Ho, Wo, channels_last)
    total = y.numel()
    if total:
        BLOCK = 4096 if interpreted() else 256
        N, C, H, W = x.shape
        _pool_kernel[(triton.cdiv(total, BLOCK),)](
            x, *x.stride(), y, *y.stride(), total, C, H, W, Ho, Wo, *s, *p, *d,
            -128 if x.dtype == torch.int8 else -32768, KH=k[0], KW=k[1], BLOCK=BLOCK)
    return y


def backward(*args):
    raise NotImplementedError("max_pool2d_int8 has no gradient (integer op)")
