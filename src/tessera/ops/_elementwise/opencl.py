"""OpenCL launchers of the activation family (kernels: activations.cl; runtime: backends/opencl.py).

One program per storage dtype holds every kernel, ``{act,glu}_{fwd,bwd}_<kind>`` (kind: silu,
gelu, gelu_tanh) and its ``_tail`` twin, so the four ops share one cold build per dtype.
Inputs are row views handed to the kernels zero-copy, with their own row strides (0 for
broadcast, 2n for a ``chunk(2, -1)`` half); outputs come from ``new_output`` (contiguous).
When every input's rows follow each other (or there is one row) the problem is launched as a
single row of M*N elements, so a short row does not idle a work-group.  Each row is covered
by two launches: whole work-groups of L columns (L the largest power of two <= min(n, 256)),
run with no bound check, then the last n mod L columns by the ``_tail`` kernel, which checks
(activations.cl says why: a check in the main kernel costs PoCL its vectorisation).  Empty
problems launch nothing (OpenCL rejects zero-size ranges).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import opencl as cl
from . import GELU, GELU_TANH, SILU

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("activations.cl")
_KIND = {SILU: "silu", GELU: "gelu", GELU_TANH: "gelu_tanh"}


def _pow2_at_most(n: int, cap: int) -> int:
    L = 1
    while L * 2 <= min(n, cap):
        L *= 2
    return L


def _launch(kernel: str, kind: int, ins, outs) -> None:
    M, N = outs[0].shape
    if M * N == 0:
        return
    if M == 1 or all(t.stride(0) == N for t in ins):
        rows, n, strides = 1, M * N, [M * N] * len(ins)   # one long row: no idle lanes at row ends
    else:
        rows, n, strides = M, N, [t.stride(0) for t in ins]
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[outs[0].dtype]})
    args = []
    for t, s in zip(ins, strides):
        args += [cl.buffer(t), cl.i64(s)]
    bouts = [cl.buffer(o) for o in outs]
    args += bouts + [cl.i64(n)]
    name = f"{kernel}_{_KIND[kind]}"
    L = _pow2_at_most(n, min(256, cl.runtime().max_wg))
    bulk = n // L * L
    cl.launch(prg, name, (bulk, rows), (L, 1), args + [cl.i64(0)], written=bouts)
    if bulk < n:
        Lt = cl.row_local_size(n - bulk)
        cl.launch(prg, name + "_tail", (Lt, rows), (Lt, 1), args + [cl.i64(bulk)], written=bouts)


def unary_forward(kind: int, x: torch.Tensor) -> torch.Tensor:
    y = new_output(tuple(x.shape), x.dtype, x.device)
    _launch("act_fwd", kind, [x], [y])
    return y


def unary_backward(kind: int, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    dx = new_output(tuple(x.shape), x.dtype, x.device)
    _launch("act_bwd", kind, [dy, x], [dx])
    return dx


def gated_forward(kind: int, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    out = new_output(tuple(gate.shape), gate.dtype, gate.device)
    _launch("glu_fwd", kind, [gate, up], [out])
    return out


def gated_backward(kind: int, dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor):
    dgate = new_output(tuple(gate.shape), gate.dtype, gate.device)
    dup = new_output(tuple(gate.shape), gate.dtype, gate.device)
    _launch("glu_bwd", kind, [dy, gate, up], [dgate, dup])
    return dgate, dup
