"""Triton kernels of linear_w4a16 / linear_w4a8 (GPU; CPU tensors under TRITON_INTERPRET=1).

One program per (BM rows of x) x (BN output features); the K loop walks one quantisation group
at a time.  The packed bytes of a group ([BN, G/2]) are unpacked in registers with a mask and a
shift: the low nibbles meet x's even columns, the high nibbles the odd ones, so no interleave is
needed -- two ``tl.dot`` per group:

    W4A16: p_g = x_even @ (lo - z).T + x_odd @ (hi - z).T       fp32 accumulation
           y  += p_g * s_g
    W4A8 : acc_g = qx_even @ (lo - z).T + qx_odd @ (hi - z).T   exact integers
           y  += fp32(acc_g) * s_g;   y *= sx                     (quant_interface epilogue)

W4A8 first quantises x per token (``triton_lang.quantize_rows``, shared with the int8 linears:
the contract's rules, ``div_rn`` and round-half-even ``rint``).  Its dot is int8 x int8 ->
int32 on GPUs; under the interpreter it is an fp32 dot, which is exact as well: every product
and partial sum of a group is an integer of magnitude <= 128 * 127 * 15 < 2^24.  fp32 dots run
with ``input_precision="ieee"`` (no TF32); fp16/bf16 x on a GPU dots in its own dtype ((q - z)
is exact there) with fp32 accumulation.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import as_fp32_param, new_output
from ...backends.triton import interpreted, next_pow2
from ...backends.triton_lang import quantize_rows, round_bf16, epilogue_act as _act
from . import ACT_CODE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _qlinear_int4_kernel(x_ptr, sxm, sx_ptr, w_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K, KG,
                         G: tl.constexpr, A8: tl.constexpr, HAS_Z: tl.constexpr, HAS_B: tl.constexpr,
                         ACT: tl.constexpr, LP_DOT: tl.constexpr, INT_DOT: tl.constexpr, RNE_BF16: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rn = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
    mm, mn = rm < M, rn < N
    j = tl.arange(0, G // 2)
    KB = K // 2
    y = tl.zeros((BM, BN), dtype=tl.float32)
    for g in range(0, KG):
        wb = tl.load(w_ptr + rn[:, None] * KB + g * (G // 2) + j[None, :], mask=mn[:, None], other=0).to(tl.int32)
        if HAS_Z:
            z = tl.load(z_ptr + rn * KG + g, mask=mn, other=8).to(tl.int32)
        else:
            z = tl.full((BN,), 8, tl.int32)
        lo = tl.trans((wb & 15) - z[:, None])      # [G/2, BN], values -15..15
        hi = tl.trans((wb >> 4) - z[:, None])
        xp = x_ptr + rm[:, None] * sxm + g * G + 2 * j[None, :]
        xe = tl.load(xp, mask=mm[:, None], other=0)
        xo = tl.load(xp + 1, mask=mm[:, None], other=0)
        if A8:
            if INT_DOT:
                acc = tl.dot(xe, lo.to(tl.int8), out_dtype=tl.int32)
                acc = tl.dot(xo, hi.to(tl.int8), acc, out_dtype=tl.int32)
                p = acc.to(tl.float32)
            else:   # exact: integers below 2^24 throughout
                p = tl.dot(xe.to(tl.float32), lo.to(tl.float32), input_precision="ieee")
                p = tl.dot(xo.to(tl.float32), hi.to(tl.float32), p, input_precision="ieee")
        elif LP_DOT:
            p = tl.dot(xe, lo.to(xe.dtype), out_dtype=tl.float32)
            p = tl.dot(xo, hi.to(xe.dtype), p, out_dtype=tl.float32)
        else:
            p = tl.dot(xe.to(tl.float32), lo.to(tl.float32), input_precision="ieee")
            p = tl.dot(xo.to(tl.float32), hi.to(tl.float32), p, input_precision="ieee")
        s = tl.load(s_ptr + rn * KG + g, mask=mn, other=0.0)
        y += p * s[None, :]
    if A8:
        y = y * tl.load(sx_ptr + rm, mask=mm, other=0.0)[:, None]
    if HAS_B:
        y = y + tl.load(b_ptr + rn, mask=mn, other=0.0)[None, :]
    y = round_bf16(_act(y, ACT), RNE_BF16)   # the interpreter's bf16 cast truncates
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])


def _blocks(M, N):
    if interpreted():   # few, large programs: the interpreter costs ~ms per program
        return max(16, min(next_pow2(M), 128)), max(16, min(next_pow2(N), 128))
    return (16 if M <= 16 else (32 if M <= 64 else 64)), 64


def _forward(a8, x, weight, weight_scale, weight_zero, group_size, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    w, s = weight.contiguous(), weight_scale.contiguous()
    z = None if weight_zero is None else weight_zero.contiguous()
    b = as_fp32_param(bias)
    sx = None
    if a8:
        x, sx = quantize_rows(x, torch.int8)  # int8 codes [M, K] contiguous + fp32 scales [M]
    BM, BN = _blocks(M, N)
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _qlinear_int4_kernel[grid](x, x.stride(0), sx if a8 else s, w, s, z if z is not None else w,
                               b if b is not None else s, y, M, N, K, K // group_size,
                               G=group_size, A8=a8, HAS_Z=z is not None, HAS_B=b is not None,
                               ACT=ACT_CODE[activation], LP_DOT=(not a8 and x.dtype != torch.float32
                                                                  and not interpreted()),
                               INT_DOT=a8 and not interpreted() and group_size >= 64,  # int8 dots need K >= 32
                               RNE_BF16=interpreted() and y.dtype == torch.bfloat16, BM=BM, BN=BN)
    return y


def forward_w4a16(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(False, x, weight, weight_scale, weight_zero, group_size, bias, activation)


def forward_w4a8(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(True, x, weight, weight_scale, weight_zero, group_size, bias, activation)
