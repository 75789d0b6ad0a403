"""OpenCL launchers of the activation family (kernels: activations.cl; runtime: backends/opencl.py).

One program per storage dtype (and TSR_NT) holds every kernel, ``{act,glu}_{fwd,bwd}_<kind>``
(kind: silu, gelu, gelu_tanh), so the four ops share one cold build per dtype.
Inputs are row views handed to the kernels zero-copy, with their own row strides (0 for
broadcast, 2n for a ``chunk(2, -1)`` half); outputs come from ``new_output`` (contiguous).
When every input's rows follow each other (or there is one row) the problem is launched as a
single row of M*N elements.  Work-item k of a row takes chunks ``per*k .. per*(k+1)-1`` of 8
elements (activations.cl): on a CPU device work-groups of one, each a span of up to _SPAN chunks
(fewer when that would leave under 8 spans per compute unit); elsewhere one chunk per work-item
in work-groups of ``vec_local_size``.  fp32 outputs of the cpu backend's NT size are streamed
(``TSR_NT``).  Empty problems launch nothing (OpenCL rejects zero-size ranges).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu, opencl as cl
from . import GELU, GELU_TANH, SILU

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("activations.cl")
_KIND = {SILU: "silu", GELU: "gelu", GELU_TANH: "gelu_tanh"}


# chunks of 8 elements per work-item on a CPU device: spans of 16 KiB of fp32 output, fewer when
# that would leave fewer than 8 spans per compute unit (the groups are PoCL's unit of load balance)
_SPAN = 512


def _launch(kernel: str, kind: int, ins, outs) -> None:
    M, N = outs[0].shape
    if M * N == 0:
        return
    if M == 1 or all(t.stride(0) == N for t in ins):
        rows, n, strides = 1, M * N, [M * N] * len(ins)   # one long row: no idle lanes at row ends
    else:
        rows, n, strides = M, N, [t.stride(0) for t in ins]
    # TSR_NT: streaming stores of the fp32 outputs (tessera_cl.h), at the cpu backend's size threshold
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[outs[0].dtype], "TSR_NT": cpu.use_nt(outs[0])})
    args = []
    for t, s in zip(ins, strides):
        args += [cl.buffer(t), cl.i64(s)]
    bouts = [cl.buffer(o) for o in outs]
    chunks = -(-n // 8)
    L = cl.vec_local_size(n)
    if L == 1:   # CPU: each work-item walks a span of chunks (float8 SIMD code, one NT fence per span)
        cu = int(cl.runtime().device.max_compute_units)
        per = max(1, min(_SPAN, -(-chunks // (8 * cu))))
    else:        # GPU: a chunk per work-item, neighbours on neighbouring chunks
        per = 1
    wis = -(-chunks // per)
    cl.launch(prg, f"{kernel}_{_KIND[kind]}", (cl.round_up(wis, L), rows), (L, 1),
              args + bouts + [cl.i64(n), cl.i64(per)], written=bouts)


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
