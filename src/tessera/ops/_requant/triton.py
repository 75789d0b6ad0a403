"""Triton kernels of the integer-only pipeline (GPU; CPU tensors under TRITON_INTERPRET=1).

``_requant_kernel``: BLOCK_M x BLOCK_C tiles of accumulators; MultiplyByQuantizedMultiplier in
int64 exactly as requant.c (branch-free selects; ``>>`` on signed int64 is arithmetic, the
truncating division by 2^31 is (v + (v < 0) * (2^31 - 1)) >> 31), per-tensor or per-channel
multiplier/shift, an optional int64 per-channel offset (bias - x_zp * sum w), then + zero point
and clamp.  linear_int8_requant / conv2d_int8 reuse the int8 GEMM of ops/_qlinear_int8/triton.py
(``tl.dot`` int8 -> int32; int16 activations split into int8 halves -> exact int64) and feed its
accumulators to this kernel; conv2d_int8 gathers its im2col rows with ``_im2col_kernel``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, param
from .._qlinear_int8.triton import int_mm_forward
from .ref import DTYPES  # noqa: F401


@triton.jit
def _mbqm(a, m, s, MODE: tl.constexpr):
    if MODE == 0:     # gemmlowp double rounding (int32 acc)
        left = tl.maximum(s, 0)
        e = tl.maximum(-s, 0)
        a = a << left
        a = tl.minimum(tl.maximum(a, -2147483648), 2147483647)
        ab = a * m
        v = ab + tl.where(ab >= 0, 1073741824, 1 - 1073741824)
        h = (v + tl.where(v < 0, 2147483647, 0)) >> 31
        h = tl.where((a == -2147483648) & (m == -2147483648), 2147483647, h)
        mask = (tl.full(h.shape, 1, tl.int64) << e) - 1
        thr = (mask >> 1) + tl.where(h < 0, 1, 0)
        r = (h >> e) + tl.where((h & mask) > thr, 1, 0)
    elif MODE == 1:   # CMSIS-NN single rounding (int32 acc)
        t = 31 - s
        r = (a * m + (tl.full(a.shape, 1, tl.int64) << (t - 1))) >> t
    else:             # int64 acc: TFLite's Q15 reduced multiplier
        x = tl.minimum(tl.maximum(a, -140737488355328), 140737488355327)
        rm = tl.where(m < 2147418112, (m + 32768) >> 16, 32767)
        t = 15 - s
        r = (x * rm + (tl.full(a.shape, 1, tl.int64) << (t - 1))) >> t
    return r


@triton.jit
def _requant_kernel(acc_ptr, sa, m_ptr, s_ptr, off_ptr, out_ptr, so, M, C, zp, qmin, qmax,
                    PER_CH: tl.constexpr, HAS_OFF: tl.constexpr, ACC64: tl.constexpr, MODE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    rm = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rc = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    msk = (rm[:, None] < M) & (rc[None, :] < C)
    a = tl.load(acc_ptr + rm[:, None] * sa + rc[None, :], mask=msk, other=0).to(tl.int64)
    if PER_CH:
        m = tl.load(m_ptr + rc, mask=rc < C, other=0).to(tl.int64)[None, :]
        s = tl.load(s_ptr + rc, mask=rc < C, other=0).to(tl.int64)[None, :]
    else:
        m = tl.load(m_ptr + rc * 0).to(tl.int64)[None, :]
        s = tl.load(s_ptr + rc * 0).to(tl.int64)[None, :]
    m = m + tl.zeros(a.shape, tl.int64)
    s = s + tl.zeros(a.shape, tl.int64)
    if HAS_OFF:
        a = a + tl.load(off_ptr + rc, mask=rc < C, other=0)[None, :]
        if not ACC64:   # int32 pipeline: acc + bias saturated to int32 before the multiplier
            a = tl.minimum(tl.maximum(a, -2147483648), 2147483647)
    r = _mbqm(a, m, s, MODE)
    y = tl.minimum(tl.maximum(r + zp, qmin), qmax)
    tl.store(out_ptr + rm[:, None] * so + rc[None, :], y.to(out_ptr.dtype.element_ty), mask=msk)


def requant_into(acc, mult, shift, off, zp, qmin, qmax, rounding, out):
    M, C = acc.shape
    if M == 0 or C == 0:
        return out
    BM, BC = (16, 128) if interpreted() else (16, 128)
    acc64 = acc.dtype == torch.int64
    mode = 2 if acc64 else (1 if rounding == "single" else 0)
    grid = (triton.cdiv(M, BM), triton.cdiv(C, BC))
    _requant_kernel[grid](acc, acc.stride(0), param(mult), param(shift), acc if off is None else off, out,
                          out.stride(0), M, C, zp, qmin, qmax, PER_CH=mult.numel() > 1, HAS_OFF=off is not None,
                          ACC64=acc64, MODE=mode, BLOCK_M=BM, BLOCK_C=BC)
    return out


def requantize_forward(acc, multiplier, shift, zero_point, qmin, qmax, rounding, out_dtype):
    out = new_output(tuple(acc.shape), out_dtype, acc.device)
    return requant_into(acc, multiplier, shift, None, zero_point, qmin, qmax, rounding, out)


def _offset(weight, bias, x_zero_point):
    """int64 [N]: bias - x_zp * sum_k w (a small O(N K) reduction of the glue, as requant.c's)."""
    off = weight.sum(1, dtype=torch.int64) * (-x_zero_point)
    return off if bias is None else off + bias.to(torch.int64)


def linear_forward(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype):
    M, N = x.shape[0], weight.shape[0]
    out = new_output((M, N), out_dtype, x.device)
    if M == 0 or N == 0:
        return out
    acc = int_mm_forward(x, weight)
    return requant_into(acc, multiplier, shift, _offset(weight, bias, x_zero_point), out_zero_point, qmin, qmax,
                        rounding, out)


@triton.jit
def _im2col_kernel(x_ptr, sn, sc, sh, sw, cols_ptr, R, KC, H, W, Ho, Wo, KH, KW, st_h, st_w, pd_h, pd_w, dl_h, dl_w,
                   pad_value, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """cols[r, (c*KH + ky)*KW + kx] = x[n, c, oy*st - pd + ky*dl, ox*st - pd + kx*dl] or pad_value."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    k = tl.program_id(1).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    n = r // (Ho * Wo)
    oy = (r // Wo) % Ho
    ox = r % Wo
    c = k // (KH * KW)
    ky = (k // KW) % KH
    kx = k % KW
    iy = oy[:, None] * st_h - pd_h + ky[None, :] * dl_h
    ix = ox[:, None] * st_w - pd_w + kx[None, :] * dl_w
    ok = (r[:, None] < R) & (k[None, :] < KC)
    inb = ok & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    v = tl.load(x_ptr + n[:, None] * sn + c[None, :] * sc + iy * sh + ix * sw, mask=inb, other=0)
    v = tl.where(inb, v, pad_value)
    tl.store(cols_ptr + r[:, None] * KC + k[None, :], v.to(cols_ptr.dtype.element_ty), mask=ok)


def conv_forward(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype,
                 stride, padding, dilation, groups, Ho, Wo):
    """im2col (padding taps = x_zp) + one int GEMM per group + the requantization; returns
    channels-last rows [N*Ho*Wo, O]."""
    Nb, C, H, W = x.shape
    O, Cg, kh, kw = weight.shape
    out = new_output((Nb * Ho * Wo, O), out_dtype, x.device)
    if out.numel() == 0:
        return out
    R, KC = Nb * Ho * Wo, C * kh * kw
    cols = new_output((R, KC), x.dtype, x.device)
    BR, BK = 64, 64
    _im2col_kernel[(triton.cdiv(R, BR), triton.cdiv(KC, BK))](
        x, *x.stride(), cols, R, KC, H, W, Ho, Wo, kh, kw, *stride, *padding, *dilation, x_zero_point,
        BLOCK_R=BR, BLOCK_K=BK)
    w2 = weight.reshape(O, Cg * kh * kw)
    off = _offset(w2, bias, x_zero_point)
    Og, Kg = O // groups, Cg * kh * kw
    per_ch = multiplier.numel() > 1
    for g in range(groups):
        o0, o1 = g * Og, (g + 1) * Og
        acc = int_mm_forward(cols[:, g * Kg:(g + 1) * Kg], w2[o0:o1])
        requant_into(acc, multiplier[o0:o1] if per_ch else multiplier, shift[o0:o1] if per_ch else shift,
                     off[o0:o1], out_zero_point, qmin, qmax, rounding, out[:, o0:o1])
    return out
