"""Activation-family launchers of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel:
activations.c, cross-compiled into the remote runner; runtime: backends/cross.py).  The same C
entry points as cpu.py (one library, the activation kind as an argument); one thread, ordinary
stores."""
from __future__ import annotations

import torch

from ..._library import new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def unary_forward(kind: int, x: torch.Tensor) -> torch.Tensor:
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    if y.numel() == 0:
        return y
    rc = cross.call("tsr_act_fwd", x, x.stride(0), y, M, N, kind, DTYPE_CODE[x.dtype], 0, 1)
    cross.check_rc(rc, "activation forward")
    return y


def unary_backward(kind: int, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    M, N = x.shape
    dx = new_output((M, N), x.dtype, x.device)
    if dx.numel() == 0:
        return dx
    rc = cross.call("tsr_act_bwd", dy, dy.stride(0), x, x.stride(0), dx, M, N, kind, DTYPE_CODE[x.dtype], 0, 1)
    cross.check_rc(rc, "activation backward")
    return dx


def gated_forward(kind: int, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    M, N = gate.shape
    out = new_output((M, N), gate.dtype, gate.device)
    if out.numel() == 0:
        return out
    rc = cross.call("tsr_glu_fwd", gate, gate.stride(0), up, up.stride(0), out, M, N, kind,
                    DTYPE_CODE[gate.dtype], 0, 1)
    cross.check_rc(rc, "gated activation forward")
    return out


def gated_backward(kind: int, dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor):
    M, N = gate.shape
    dgate = new_output((M, N), gate.dtype, gate.device)
    dup = new_output((M, N), gate.dtype, gate.device)
    if dgate.numel() == 0:
        return dgate, dup
    rc = cross.call("tsr_glu_bwd", dy, dy.stride(0), gate, gate.stride(0), up, up.stride(0), dgate, dup, M, N,
                    kind, DTYPE_CODE[gate.dtype], 0, 1)
    cross.check_rc(rc, "gated activation backward")
    return dgate, dup
