"""Triton kernels of the activation family (GPU; CPU tensors under TRITON_INTERPRET=1).

One kernel, specialised at compile time by ``OP`` (unary/gated x forward/backward)
and ``KIND`` (silu, gelu, gelu_tanh), walks the flat element index of the
contiguous output in BLOCK-sized tiles.  Inputs are row views: when every input's
rows are back to back (``CONTIG``) the flat index addresses them directly;
otherwise the row and column are recovered once per element and each input adds
its own row stride (0 for broadcast, 2n for a ``chunk`` of a fused projection).
Offsets are int64.

Math is fp32 with the same limits as the CPU kernel (act(-inf) = 0, act'(+inf) = 1,
inputs clamped to +-FLT_MAX, 1 - sigmoid computed without cancellation); the erf
form uses Triton's ``erf`` (libdevice on GPUs).  Under the interpreter one program
covers up to 64 Ki elements (the interpreter pays per program).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

UNARY_FWD, UNARY_BWD, GATED_FWD, GATED_BWD = 0, 1, 2, 3


@triton.jit
def _act(x, KIND: tl.constexpr):
    """(act(x), act'(x)) in fp32 for KIND 0 = silu, 1 = gelu (erf), 2 = gelu (tanh)."""
    xin = x
    x = tl.where(x > 3.4028234663852886e38, 3.4028234663852886e38, x)
    x = tl.where(x < -3.4028234663852886e38, -3.4028234663852886e38, x)
    if KIND == 0:
        e = tl.exp(-x)
        s = 1.0 / (1.0 + e)
        s1m = tl.where(x >= 0.0, e * s, 1.0 - s)
        y = x * s
        d = s * (1.0 + x * s1m)
    elif KIND == 1:
        e = tl.exp(-0.5 * x * x)          # 0 once x^2 overflows
        Phi = 0.5 * (1.0 + tl.math.erf(x * 0.70710678118654752))
        y = x * Phi
        d = Phi + x * (e * 0.39894228040143268)
    else:
        z = 1.5957691216057308 * x * (1.0 + 0.044715 * x * x)   # 2 sqrt(2/pi) (x + k x^3)
        e = tl.exp(-z)
        s = 1.0 / (1.0 + e)
        s1m = tl.where(z >= 0.0, e * s, 1.0 - s)
        # beyond |x| = 1e6, s (1 - s) is exactly 0: the clamp only keeps x^2 finite
        xd = tl.where(x > 1e6, 1e6, tl.where(x < -1e6, -1e6, x))
        dz = 1.5957691216057308 * (1.0 + 3.0 * 0.044715 * xd * xd)
        y = x * s
        d = s + xd * (s * s1m) * dz
    y = tl.where(xin > 3.4028234663852886e38, xin, y)   # act(+inf) = +inf, not FLT_MAX
    return y, d


@triton.jit
def _ew_kernel(a_ptr, sa, b_ptr, sb, c_ptr, sc, o0_ptr, o1_ptr, E, N,
               OP: tl.constexpr, KIND: tl.constexpr, CONTIG: tl.constexpr, BLOCK: tl.constexpr):
    # inputs per OP: UNARY_FWD (x), UNARY_BWD (dy, x), GATED_FWD (gate, up), GATED_BWD (dy, gate, up)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < E
    if CONTIG:
        ia = offs
        ib = offs
        ic = offs
    else:
        r = offs // N
        col = offs - r * N
        ia = r * sa + col
        ib = r * sb + col
        ic = r * sc + col
    a = tl.load(a_ptr + ia, mask=mask, other=0.0).to(tl.float32)
    if OP == 0:
        y, d = _act(a, KIND)
        tl.store(o0_ptr + offs, y.to(o0_ptr.dtype.element_ty), mask=mask)
    elif OP == 1:
        x = tl.load(b_ptr + ib, mask=mask, other=0.0).to(tl.float32)
        y, d = _act(x, KIND)
        tl.store(o0_ptr + offs, (a * d).to(o0_ptr.dtype.element_ty), mask=mask)
    elif OP == 2:
        u = tl.load(b_ptr + ib, mask=mask, other=0.0).to(tl.float32)
        y, d = _act(a, KIND)
        tl.store(o0_ptr + offs, (y * u).to(o0_ptr.dtype.element_ty), mask=mask)
    else:
        g = tl.load(b_ptr + ib, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(c_ptr + ic, mask=mask, other=0.0).to(tl.float32)
        y, d = _act(g, KIND)
        tl.store(o0_ptr + offs, (a * u * d).to(o0_ptr.dtype.element_ty), mask=mask)
        tl.store(o1_ptr + offs, (a * y).to(o1_ptr.dtype.element_ty), mask=mask)


def _block(E: int) -> int:
    if interpreted():
        return min(max(next_pow2(E), 16), 1 << 16)
    return 2048


def _launch(op: int, kind: int, ins, outs) -> None:
    M, N = outs[0].shape
    E = M * N
    if E == 0:
        return
    contig = all(M == 1 or t.stride(0) == N for t in ins)
    a, b, c = (list(ins) + [ins[0]] * 2)[:3]
    o0, o1 = (list(outs) + [outs[0]])[:2]
    BLOCK = _block(E)
    _ew_kernel[(triton.cdiv(E, BLOCK),)](
        a, a.stride(0), b, b.stride(0), c, c.stride(0), o0, o1, E, N,
        OP=op, KIND=kind, CONTIG=contig, BLOCK=BLOCK)


def unary_forward(kind: int, x):
    y = new_output(tuple(x.shape), x.dtype, x.device)
    _launch(UNARY_FWD, kind, [x], [y])
    return y


def unary_backward(kind: int, dy, x):
    dx = new_output(tuple(x.shape), x.dtype, x.device)
    _launch(UNARY_BWD, kind, [dy, x], [dx])
    return dx


def gated_forward(kind: int, gate, up):
    out = new_output(tuple(gate.shape), gate.dtype, gate.device)
    _launch(GATED_FWD, kind, [gate, up], [out])
    return out


def gated_backward(kind: int, dy, gate, up):
    dgate = new_output(tuple(gate.shape), gate.dtype, gate.device)
    dup = new_output(tuple(gate.shape), gate.dtype, gate.device)
    _launch(GATED_BWD, kind, [dy, gate, up], [dgate, dup])
    return dgate, dup
