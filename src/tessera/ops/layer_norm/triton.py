"""LayerNorm Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

Forward: one program per row.  Statistics are fp32 and two-pass: the mean first,
then sum((h - mean)^2), so rows with |mean| >> std do not cancel.  The mean is
taken of h - h[0] (a shift by the row's first element): a constant row then gives
h - mean == 0 exactly (variance 0, y == bias), and h - mean is formed as
(h - shift) - (mean - shift), which keeps the low bits that a rounded fp32 mean
loses when |mean| >> std.  When a row fits one BLOCK_N chunk (ONE_BLOCK) it
stays in registers; otherwise the row is walked in chunks three times (sum,
squared deviations, normalise).  With a
residual, the first walk stores h = x + residual rounded to the activation
dtype and later walks read that stored h, as the CPU kernel does.

Backward: a grid of G programs, each owning a contiguous block of rows and one
fp32 row of dweight and dbias partials (no atomics, deterministic); the launcher
reduces the G partial rows once.  Offsets are int64 (row * stride may exceed 2^31).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, param, row_block

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _load_h(x_ptr, sx, r_ptr, sr, h_ptr, row, cols, mask, HAS_RES: tl.constexpr, STORE_H: tl.constexpr):
    """fp32 h for these columns: x (+ residual, rounded to the activation dtype; stored to this
    row's h (h_ptr) when STORE_H)."""
    v = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        v = v + tl.load(r_ptr + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
        hv = v.to(h_ptr.dtype.element_ty)
        if STORE_H:
            tl.store(h_ptr + cols, hv, mask=mask)
        v = hv.to(tl.float32)
    return v


@triton.jit
def _layer_norm_fwd_kernel(x_ptr, sx, r_ptr, sr, w_ptr, b_ptr, y_ptr, h_ptr, mean_ptr, rstd_ptr, N, eps,
                           HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                           ONE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    out_off = row * N
    h_row = h_ptr + out_off
    # shift: h[row, 0] in the activation dtype's rounding, identical to the stored h
    first = tl.arange(0, BLOCK_N) < 1
    shift = tl.sum(_load_h(x_ptr, sx, r_ptr, sr, h_row, row, tl.arange(0, BLOCK_N), first,
                           HAS_RES, False), axis=0)
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        v = _load_h(x_ptr, sx, r_ptr, sr, h_row, row, cols, mask, HAS_RES, True)
        delta = tl.sum(tl.where(mask, v - shift, 0.0), axis=0) / N
        d = tl.where(mask, (v - shift) - delta, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            v = _load_h(x_ptr, sx, r_ptr, sr, h_row, row, cols, mask, HAS_RES, True)
            acc += tl.where(mask, v - shift, 0.0)
        delta = tl.sum(acc, axis=0) / N
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            src = h_row + cols if HAS_RES else x_ptr + row * sx + cols
            d = tl.where(mask, (tl.load(src, mask=mask, other=0.0).to(tl.float32) - shift) - delta, 0.0)
            acc += d * d
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(mean_ptr + row, shift + delta)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        if ONE_BLOCK:
            dc = d  # the single chunk, still in registers
        else:
            src = h_row + cols if HAS_RES else x_ptr + row * sx + cols
            dc = (tl.load(src, mask=mask, other=0.0).to(tl.float32) - shift) - delta
        yv = dc * rstd
        if HAS_W:
            yv = yv * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            yv = yv + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + out_off + cols, yv.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_bwd_kernel(dy_ptr, sdy, dh_ptr, sdh, h_ptr, sh, w_ptr, mean_ptr, rstd_ptr, dx_ptr,
                           dwp_ptr, dbp_ptr, M, N, rows_per_prog,
                           HAS_DH: tl.constexpr, HAS_W: tl.constexpr, HAS_DB: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    row0 = pid.to(tl.int64) * rows_per_prog
    dwp_row = dwp_ptr + pid.to(tl.int64) * N
    dbp_row = dbp_ptr + pid.to(tl.int64) * N
    for i in range(0, rows_per_prog):
        row = row0 + i
        if row < M:
            mu = tl.load(mean_ptr + row)
            r = tl.load(rstd_ptr + row)
            # pass 1: sums of g and g * xhat with g = dy * w, xhat = (h - mean) * rstd
            acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
            acc_gx = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < N
                g = tl.load(dy_ptr + row * sdy + cols, mask=mask, other=0.0).to(tl.float32)
                hv = tl.load(h_ptr + row * sh + cols, mask=mask, other=0.0).to(tl.float32)
                if HAS_W:
                    g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                acc_g += g
                acc_gx += tl.where(mask, g * (hv - mu) * r, 0.0)
            c1 = tl.sum(acc_g, axis=0) / N
            c2 = tl.sum(acc_gx, axis=0) / N
            # pass 2: dx = r * (g - c1 - xhat * c2) (+ dh); partials dw += dy * xhat, db += dy
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < N
                dy = tl.load(dy_ptr + row * sdy + cols, mask=mask, other=0.0).to(tl.float32)
                xhat = (tl.load(h_ptr + row * sh + cols, mask=mask, other=0.0).to(tl.float32) - mu) * r
                g = dy
                if HAS_W:
                    g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                    part = tl.load(dwp_row + cols, mask=mask, other=0.0)
                    tl.store(dwp_row + cols, part + dy * xhat, mask=mask)
                if HAS_DB:
                    part = tl.load(dbp_row + cols, mask=mask, other=0.0)
                    tl.store(dbp_row + cols, part + dy, mask=mask)
                dx = r * (g - c1 - xhat * c2)
                if HAS_DH:
                    dx += tl.load(dh_ptr + row * sdh + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + row * N + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _programs(M: int, device: torch.device) -> int:
    if interpreted() or device.type != "cuda":
        return max(1, min(M, 4))  # the interpreter pays per program
    return max(1, min(M, 4 * torch.cuda.get_device_properties(device).multi_processor_count))


def forward(x, weight, bias, residual, eps):
    M, N = x.shape
    weight, bias = param(weight), param(bias)  # strided / broadcast parameters: see param()
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    mean = new_output((M,), torch.float32, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, mean, rstd
    block = row_block(N)
    _layer_norm_fwd_kernel[(M,)](
        x, x.stride(0), x if residual is None else residual, 0 if residual is None else residual.stride(0),
        x if weight is None else weight, x if bias is None else bias, y, y if h is None else h,
        mean, rstd, N, eps, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        ONE_BLOCK=N <= block, BLOCK_N=block)
    return y, h, mean, rstd


def backward(dy, dh, h, weight, bias, mean, rstd, eps):
    M, N = h.shape
    weight = param(weight)
    dx = new_output((M, N), h.dtype, h.device)
    G = _programs(M, h.device)
    dwp = torch.zeros((G, N), dtype=torch.float32, device=h.device) if weight is not None else None
    dbp = torch.zeros((G, N), dtype=torch.float32, device=h.device) if bias is not None else None
    if M > 0:
        per = triton.cdiv(M, G)
        _layer_norm_bwd_kernel[(G,)](
            dy, dy.stride(0), dy if dh is None else dh, 0 if dh is None else dh.stride(0), h, h.stride(0),
            h if weight is None else weight, mean, rstd, dx, dx if dwp is None else dwp,
            dx if dbp is None else dbp, M, N, per,
            HAS_DH=dh is not None, HAS_W=weight is not None, HAS_DB=bias is not None, BLOCK_N=row_block(N))
    dw = None if dwp is None else dwp.sum(0)
    db = None if dbp is None else dbp.sum(0)
    return dx, dw, db
