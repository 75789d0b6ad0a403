"""Softmax Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

Forward: one program per row on a GPU.  A row that fits one block
(N <= BLOCK_N, ``ONE_BLOCK``) is loaded once and kept in registers.  Longer
rows use online softmax: each BLOCK_N chunk updates a running max m and a sum
s rescaled by exp(m_old - m_new) when the max grows, so any row length works
with one read for the statistics and one more to write y.

Numerics follow ref.py: the shift is max(x), or 0 when the row is entirely
-inf (masked lanes load -inf too), so exp gives 0 and s = 0; the scale
sum s = 0 is replaced by 1 (fully masked row -> 0 / 1 = zeros, as the
reference) and a NaN s stays NaN (a row with +inf or NaN -> NaN everywhere).  All math fp32.

Backward: dx = y * (dy - sum(dy * y)), the same two shapes (one block, or a
sum over chunks then a second pass).

bf16 outputs are rounded to nearest even explicitly (:func:`_round_bf16`): the
triton 3.7 interpreter truncates fp32 -> bf16 casts (even with
``fp_downcast_rounding="rtne"``), which biases every softmax value low by up to
an ulp and pushes the bf16 gradient past the tolerance.  On a GPU the native
cast already rounds to nearest even, so the explicit rounding gives the same
bits for a few integer ops per element of a memory-bound kernel.

Under the interpreter each program costs ~3 ms, so the launcher runs a few
programs that each loop over a contiguous block of rows; on a GPU every
program owns one row.  Row offsets are int64 (row * stride may exceed 2^31).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, row_block
from ...backends.triton_lang import round_bf16 as _round_bf16

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _softmax_fwd_kernel(x_ptr, sx, y_ptr, M, N, rows_per_prog,
                        BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr, RNE_BF16: tl.constexpr):
    pid = tl.program_id(0)
    row0 = pid.to(tl.int64) * rows_per_prog
    for i in range(0, rows_per_prog):
        row = row0 + i
        if row < M:
            x_row = x_ptr + row * sx
            y_row = y_ptr + row * N
            if ONE_BLOCK:
                cols = tl.arange(0, BLOCK_N)
                mask = cols < N
                v = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
                m = tl.max(v, axis=0)
                ms = tl.where(m == float("-inf"), 0.0, m)
                e = tl.exp(v - ms)
                s = tl.sum(e, axis=0)
                inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # masked row: e = 0, so 0 * 1
                y = _round_bf16(e * inv, RNE_BF16)
                tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
            else:
                # 0-d fp32 loop-carried statistics (built by reductions so their type is fixed)
                m = tl.max(tl.full((BLOCK_N,), float("-inf"), tl.float32), axis=0)
                s = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
                for start in range(0, N, BLOCK_N):
                    cols = start + tl.arange(0, BLOCK_N)
                    v = tl.load(x_row + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
                    mn = tl.maximum(m, tl.max(v, axis=0))
                    ms = tl.where(mn == float("-inf"), 0.0, mn)
                    # exp(m - ms) = 0 while every element so far was -inf (m = -inf, ms finite)
                    s = s * tl.exp(m - ms) + tl.sum(tl.exp(v - ms), axis=0)
                    m = mn
                ms = tl.where(m == float("-inf"), 0.0, m)
                inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # masked row: e = 0, so 0 * 1
                for start in range(0, N, BLOCK_N):
                    cols = start + tl.arange(0, BLOCK_N)
                    mask = cols < N
                    v = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
                    y = _round_bf16(tl.exp(v - ms) * inv, RNE_BF16)
                    tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_kernel(dy_ptr, sdy, y_ptr, sy, dx_ptr, M, N, rows_per_prog,
                        BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr, RNE_BF16: tl.constexpr):
    pid = tl.program_id(0)
    row0 = pid.to(tl.int64) * rows_per_prog
    for i in range(0, rows_per_prog):
        row = row0 + i
        if row < M:
            dy_row = dy_ptr + row * sdy
            y_row = y_ptr + row * sy
            dx_row = dx_ptr + row * N
            if ONE_BLOCK:
                cols = tl.arange(0, BLOCK_N)
                mask = cols < N
                g = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
                yv = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
                dot = tl.sum(g * yv, axis=0)
                dx = _round_bf16(yv * (g - dot), RNE_BF16)
                tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            else:
                acc = tl.zeros((BLOCK_N,), tl.float32)
                for start in range(0, N, BLOCK_N):
                    cols = start + tl.arange(0, BLOCK_N)
                    mask = cols < N
                    g = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
                    yv = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
                    acc += g * yv
                dot = tl.sum(acc, axis=0)
                for start in range(0, N, BLOCK_N):
                    cols = start + tl.arange(0, BLOCK_N)
                    mask = cols < N
                    g = tl.load(dy_row + cols, mask=mask, other=0.0).to(tl.float32)
                    yv = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
                    dx = _round_bf16(yv * (g - dot), RNE_BF16)
                    tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _launch(M: int, N: int, dtype: torch.dtype, device: torch.device):
    """(grid, rows per program, kernel constexprs and launch options) for M rows of N."""
    block = row_block(N)
    if interpreted() or device.type != "cuda":
        G = max(1, min(M, 4))  # the interpreter pays per program: few programs, many rows each
    else:
        G = M
    per = triton.cdiv(M, G)
    warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    return (G,), per, dict(BLOCK_N=block, ONE_BLOCK=N <= block, RNE_BF16=dtype == torch.bfloat16,
                           num_warps=warps)


def forward(x):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    grid, per, kw = _launch(M, N, x.dtype, x.device)
    _softmax_fwd_kernel[grid](x, x.stride(0), y, M, N, per, **kw)
    return y


def backward(dy, y):
    M, N = y.shape
    dx = new_output((M, N), y.dtype, y.device)
    if M == 0 or N == 0:
        return dx
    grid, per, kw = _launch(M, N, y.dtype, y.device)
    _softmax_bwd_kernel[grid](dy, dy.stride(0), y, y.stride(0), dx, M, N, per, **kw)
    return dx
