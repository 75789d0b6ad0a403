"""RMSNorm Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

Forward: one program per row; the row is walked in BLOCK_N chunks twice (sum of
squares, then normalise), so any hidden size works and rows <= BLOCK_N are one
chunk.  With a residual, pass 1 also stores h = x + residual (rounded to the
activation dtype) and pass 2 normalises that stored h, as the CPU kernel does.

Backward: a grid of G programs, each owning a contiguous block of rows and one
fp32 row of dweight partials (no atomics, deterministic); the launcher reduces
the G partial rows once.  Offsets are int64 (row * stride may exceed 2^31).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, param, row_block

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rms_norm_fwd_kernel(x_ptr, sx, r_ptr, sr, w_ptr, y_ptr, h_ptr, rstd_ptr, N, eps,
                         HAS_RES: tl.constexpr, HAS_W: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sx
    out_off = row * N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            v = v + tl.load(r_ptr + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
            hv = v.to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + out_off + cols, hv, mask=mask)
            v = hv.to(tl.float32)
        acc += v * v
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        if HAS_RES:
            v = tl.load(h_ptr + out_off + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        v = v * rstd
        if HAS_W:
            v = v * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + out_off + cols, v.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(dy_ptr, sdy, dh_ptr, sdh, h_ptr, sh, w_ptr, rstd_ptr, dx_ptr, dwp_ptr,
                         M, N, rows_per_prog,
                         HAS_DH: tl.constexpr, HAS_W: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    row0 = pid.to(tl.int64) * rows_per_prog
    dwp_row = dwp_ptr + pid.to(tl.int64) * N
    for i in range(0, rows_per_prog):
        row = row0 + i
        if row < M:
            r = tl.load(rstd_ptr + row)
            # pass 1: dot = sum(g * h) with g = dy * w
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < N
                g = tl.load(dy_ptr + row * sdy + cols, mask=mask, other=0.0).to(tl.float32)
                hv = tl.load(h_ptr + row * sh + cols, mask=mask, other=0.0).to(tl.float32)
                if HAS_W:
                    g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                acc += g * hv
            c = tl.sum(acc, axis=0) * r * r / N
            # pass 2: dx = r * (g - h * c) (+ dh); dweight partial += dy * h * r
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = cols < N
                dy = tl.load(dy_ptr + row * sdy + cols, mask=mask, other=0.0).to(tl.float32)
                hv = tl.load(h_ptr + row * sh + cols, mask=mask, other=0.0).to(tl.float32)
                g = dy
                if HAS_W:
                    g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                    part = tl.load(dwp_row + cols, mask=mask, other=0.0)
                    tl.store(dwp_row + cols, part + dy * hv * r, mask=mask)
                dx = r * (g - hv * c)
                if HAS_DH:
                    dx += tl.load(dh_ptr + row * sdh + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + row * N + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _programs(M: int, device: torch.device) -> int:
    if interpreted() or device.type != "cuda":
        return max(1, min(M, 4))  # the interpreter pays per program
    return max(1, min(M, 4 * torch.cuda.get_device_properties(device).multi_processor_count))


def forward(x, weight, residual, eps):
    M, N = x.shape
    weight = param(weight)  # strided / broadcast (stride 0) weights: see backends.triton.param
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, rstd
    _rms_norm_fwd_kernel[(M,)](
        x, x.stride(0), x if residual is None else residual, 0 if residual is None else residual.stride(0),
        x if weight is None else weight, y, y if h is None else h, rstd, N, eps,
        HAS_RES=residual is not None, HAS_W=weight is not None, BLOCK_N=row_block(N))
    return y, h, rstd


def backward(dy, dh, h, weight, rstd, eps):
    M, N = h.shape
    weight = param(weight)
    dx = new_output((M, N), h.dtype, h.device)
    G = _programs(M, h.device)
    dwp = torch.zeros((G, N), dtype=torch.float32, device=h.device) if weight is not None else None
    if M > 0:
        per = triton.cdiv(M, G)
        _rms_norm_bwd_kernel[(G,)](
            dy, dy.stride(0), dy if dh is None else dh, 0 if dh is None else dh.stride(0), h, h.stride(0),
            h if weight is None else weight, rstd, dx, dx if dwp is None else dwp, M, N, per,
            HAS_DH=dh is not None, HAS_W=weight is not None, BLOCK_N=row_block(N))
    dw = None if dwp is None else dwp.sum(0)
    return dx, dw
