"""Cross-entropy Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).  Contract: glue.py.

Forward: each program owns a contiguous block of rows; a row is walked twice in BLOCK_V chunks.
Pass 1 is the online log-sum-exp (running max m and sum s = sum exp(z - m), rescaled by
exp(m_old - m_new) when a chunk raises the max; a chunk that is all -inf is shifted by 0, so it
adds exps of 0, never NaN), plus sum(z) for label smoothing and z at the target.  Pass 2 (only
with a gradient buffer) re-reads each chunk and stores
``dx = scale_i * (p (1 + 2 zl lse) - ls/V - (1 - ls)[j == t]) * (1 - (z/softcap)^2)``; in place
(``dx`` is ``x``, the fused linear cross-entropy's logits chunk) each chunk is read before it is
overwritten, and the target's logit was read in pass 1.  Softcap's tanh is the CPU kernel's:
a + a^3 P(a^2) below 0.625, 1 - 2/(1 + e^{2a}) above.  Row losses are assembled as
(m - z_t) + log(s) to keep the digits of a row whose target holds the max.

Backward: dx = d * g row by row.  Offsets are int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2
from . import glue

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _softcap(x, cap):
    """(cap * tanh(x / cap), 1 - tanh^2)."""
    y = x / cap
    a = tl.abs(y)
    s = tl.minimum(a, 0.625)  # the polynomial's range (x = +-inf would make it inf - inf; unused there)
    u = s * s
    p = -5.731123499572277e-3
    p = p * u + 2.066466398537159e-2
    p = p * u - 5.374842509627342e-2
    p = p * u + 1.3331560790538788e-1
    p = p * u - 3.333328664302826e-1
    ts = s + s * u * p
    q = 2.0 / (1.0 + tl.exp(tl.minimum(2.0 * a, 88.0)))
    small = a < 0.625
    t = tl.where(small, ts, 1.0 - q)
    d = tl.where(small, 1.0 - ts * ts, q * (2.0 - q))
    return cap * tl.where(y < 0, -t, t), d


@triton.jit
def _ce_fwd_kernel(x_ptr, sx, t_ptr, dx_ptr, sdx, rs_ptr, loss_ptr, lse_ptr, M, V, rows_per_prog,
                   ignore_index, ls, zl, cap, scale,
                   HAS_GRAD: tl.constexpr, HAS_RS: tl.constexpr, CAP: tl.constexpr, SMOOTH: tl.constexpr,
                   BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    row0 = pid.to(tl.int64) * rows_per_prog
    for r in range(0, rows_per_prog):
        row = row0 + r
        if row < M:
            x_row = x_ptr + row * sx
            t = tl.load(t_ptr + row)
            valid = t != ignore_index
            m = -float("inf")
            s = 0.0
            sumz = 0.0
            zt = 0.0
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                mask = cols < V
                z = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
                if CAP:
                    z, _d = _softcap(z, cap)
                    z = tl.where(mask, z, -float("inf"))
                if SMOOTH:
                    sumz += tl.sum(tl.where(mask, z, 0.0), axis=0)
                zt += tl.sum(tl.where(cols == t, z, 0.0), axis=0)
                bm = tl.max(z, axis=0)
                m_new = tl.maximum(m, bm)
                shift = tl.where(m_new == -float("inf"), 0.0, m_new)
                s = s * tl.exp(m - shift) + tl.sum(tl.exp(z - shift), axis=0)
                m = m_new
            m = tl.where(m == -float("inf"), 0.0, m)
            log_s = tl.log(s)
            lse = m + log_s
            loss = (1.0 - ls) * (m - zt) + log_s
            if SMOOTH:
                loss += ls * (m - sumz / V)
            loss += zl * lse * lse
            tl.store(lse_ptr + row, lse)
            tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
            if HAS_GRAD:
                si = scale
                if HAS_RS:
                    si = si * tl.load(rs_ptr + row)
                si = tl.where(valid, si, 0.0)
                amp = si * (1.0 + 2.0 * zl * lse)
                c = si * ls / V
                for start in range(0, V, BLOCK_V):
                    cols = start + tl.arange(0, BLOCK_V)
                    mask = cols < V
                    z = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
                    d = 1.0
                    if CAP:
                        z, d = _softcap(z, cap)
                    p = tl.exp(tl.where(mask, z - lse, -float("inf")))  # lanes past V: 0, no overflow
                    g = p * amp - c - tl.where(cols == t, si * (1.0 - ls), 0.0)
                    g = tl.where(valid, g * d, 0.0)  # an ignored row is 0 even if its logits are NaN
                    tl.store(dx_ptr + row * sdx + cols, g.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _ce_bwd_kernel(d_ptr, sd, g_ptr, sg, dx_ptr, M, V, rows_per_prog, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    row0 = pid.to(tl.int64) * rows_per_prog
    for r in range(0, rows_per_prog):
        row = row0 + r
        if row < M:
            gi = tl.load(g_ptr + row * sg)
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                mask = cols < V
                v = tl.load(d_ptr + row * sd + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + row * V + cols, (v * gi).to(dx_ptr.dtype.element_ty), mask=mask)


def _grid(M: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program): the interpreter pays per program, so it gets a few."""
    if interpreted() or device.type != "cuda":
        G = max(1, min(M, 4))
    else:
        G = max(1, min(M, 8 * torch.cuda.get_device_properties(device).multi_processor_count))
    return G, triton.cdiv(M, G)


def _block(V: int) -> int:
    return min(max(next_pow2(V), 16), 8192 if interpreted() else 4096)


def loss_rows(x, target, ignore_index, label_smoothing, z_loss, softcap, dx=None, scale=1.0, row_scale=None):
    M, V = x.shape
    loss = new_output((M,), torch.float32, x.device)
    lse = new_output((M,), torch.float32, x.device)
    if M == 0:
        return loss, lse
    G, per = _grid(M, x.device)
    _ce_fwd_kernel[(G,)](
        x, x.stride(0), target, x if dx is None else dx, 0 if dx is None else dx.stride(0),
        loss if row_scale is None else row_scale, loss, lse, M, V, per,
        ignore_index, label_smoothing, z_loss, softcap if softcap > 0 else 1.0, scale,
        HAS_GRAD=dx is not None, HAS_RS=row_scale is not None, CAP=softcap > 0, SMOOTH=label_smoothing > 0,
        BLOCK_V=_block(V))
    return loss, lse


def forward(x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad):
    return glue.forward(loss_rows, x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad)


def backward(d, g):
    M, V = d.shape
    dx = new_output((M, V), d.dtype, d.device)
    if M == 0:
        return dx
    G, per = _grid(M, d.device)
    _ce_bwd_kernel[(G,)](d, d.stride(0), g, g.stride(0), dx, M, V, per, BLOCK_V=_block(V))
    return dx
