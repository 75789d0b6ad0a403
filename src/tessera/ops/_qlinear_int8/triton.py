"""Triton kernels of the int8 matmuls (GPU; CPU tensors under TRITON_INTERPRET=1).

* ``triton_lang.quantize_rows`` (shared with linear_w4a8): per-token quantisation of x (one
  program per row, two passes over K: amax, then q = div_rn(x, scale) -- a true IEEE
  division -- NaN -> 0, saturate, round half to even), the integer contract bit for bit.  A
  small first kernel rather than fused into every matmul program: the per-row amax needs all
  of K, and recomputing it in each of the N / BLOCK_N programs of a row costs more than one pass.
* ``_imm_kernel``: tiles of BLOCK_M x BLOCK_N, K in BLOCK_K steps, ``tl.dot`` on int8 tiles
  with int32 accumulation (exact; K <= 131071, enforced, keeps the sums in int32).  int16
  activations are split into int8 halves, a = 256 * hi + lo' + 128 with hi = a >> 8 and
  lo' = (a & 255) - 128 (both in -128..127), so a @ w.T = 256 * (hi @ w.T) + lo' @ w.T
  + 128 * colsum(w), combined in int64 (three int32 sums, each exact: hi @ w.T and lo' @ w.T
  are int8 x int8 sums, |.| <= K * 2^14 < 2^31 under the same K <= 131071 bound, so this path
  needs no int64 flush; the CPU's VPDPWSSD lanes, which sum int16 x int8 products, do).
  The epilogue (linears) is fp32: acc * (sx * sw) + bias, then the activation (as
  qlinear_epilogue.h), stored in x.dtype (bf16 rounded to nearest even with ``round_bf16``
  under the interpreter, whose own cast truncates).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted
from ...backends.triton_lang import quantize_rows as _quantize_rows, round_bf16, epilogue_act as _act
from .ref import ACT_CODE, DTYPES, INT_DTYPES  # noqa: F401


@triton.jit
def _imm_kernel(a_ptr, sa, b_ptr, c_ptr, sx_ptr, sw_ptr, bias_ptr, M, N, K,
                A16: tl.constexpr, EPI: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                RNE_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pm = tl.program_id(0).to(tl.int64)
    pn = tl.program_id(1).to(tl.int64)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    if A16:
        acc_hi = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        csum = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * sa + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0)
        b = tl.load(b_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0)
        if A16:
            a32 = a.to(tl.int32)
            hi = (a32 >> 8).to(tl.int8)
            lo = ((a32 & 255) - 128).to(tl.int8)
            acc += tl.dot(lo, b, out_dtype=tl.int32)
            acc_hi += tl.dot(hi, b, out_dtype=tl.int32)
            csum += tl.sum(b.to(tl.int32), axis=0)
        else:
            acc += tl.dot(a, b, out_dtype=tl.int32)
    if A16:
        res = acc_hi.to(tl.int64) * 256 + acc.to(tl.int64) + csum.to(tl.int64)[None, :] * 128
    else:
        res = acc
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if EPI:
        sx = tl.load(sx_ptr + rm, mask=rm < M, other=0.0)
        sw = tl.load(sw_ptr + rn, mask=rn < N, other=0.0)
        y = res.to(tl.float32) * (sx[:, None] * sw[None, :])
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
        y = round_bf16(_act(y, ACT), RNE_BF16)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], y.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], res.to(c_ptr.dtype.element_ty), mask=mask)


def _blocks(M, K):
    if interpreted():  # few, large programs (the interpreter pays per program and per K step:
        return 16, 32, (512 if K > 4096 else 64)  # K = 131071 takes 0.7 s instead of 5 s)
    return (16 if M <= 16 else 64), 64, 128


def _launch(a, b, out, sx=None, sw=None, bias=None, activation=None, rne_bf16=False):
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return out
    BM, BN, BK = _blocks(M, K)
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    epi = sx is not None
    _imm_kernel[grid](a, a.stride(0), b, out, sx if epi else out, sw if epi else out,
                      bias if bias is not None else out, M, N, K,
                      A16=a.dtype == torch.int16, EPI=epi, HAS_BIAS=bias is not None, ACT=ACT_CODE[activation],
                      RNE_BF16=rne_bf16, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)
    return out


def int_mm_forward(a, b):
    out = new_output((a.shape[0], b.shape[0]), torch.int32 if a.dtype == torch.int8 else torch.int64, a.device)
    return _launch(a, b, out)


def quantize_rows(x, bits):
    """(q [M, K] int8/int16 contiguous, fp32 scales [M]) per the integer contract."""
    return _quantize_rows(x, torch.int8 if bits == 8 else torch.int16)


def linear_forward(x, weight, sw, bias, activation, bits):
    q, sx = quantize_rows(x, bits)
    y = new_output((x.shape[0], weight.shape[0]), x.dtype, x.device)
    return _launch(q, weight, y, sx, sw, bias, activation,
                   rne_bf16=interpreted() and x.dtype == torch.bfloat16)
