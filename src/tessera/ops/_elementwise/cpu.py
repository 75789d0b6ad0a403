"""Native CPU launchers of the activation family (kernel: activations.c).

One library serves all four ops: the C entry points take the activation kind.
Threads follow ``cpu.threads_for(numel)`` and the C side splits the *elements*
(not rows) across them; fp32 outputs of 8 MiB and more use non-temporal stores (the kernel
keeps plain stores for fp16/bf16 outputs, where streaming was up to 2.4x slower: activations.c).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("activations.c")


def _lib():
    return cpu.library("activations", _SRC)


def _common(t: torch.Tensor):
    return cpu.DTYPE_CODE[t.dtype], cpu.threads_for(t.numel())


def unary_forward(kind: int, x: torch.Tensor) -> torch.Tensor:
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    if y.numel() == 0:
        return y
    f = cpu.declare(_lib(), "tsr_act_fwd", "plplliiii")
    dt, nth = _common(x)
    rc = f(cpu.ptr(x), x.stride(0), cpu.ptr(y), M, N, kind, dt, cpu.use_nt(y), nth)
    cpu.check_rc(rc, "activation forward")
    return y


def unary_backward(kind: int, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    M, N = x.shape
    dx = new_output((M, N), x.dtype, x.device)
    if dx.numel() == 0:
        return dx
    f = cpu.declare(_lib(), "tsr_act_bwd", "plplplliiii")
    dt, nth = _common(x)
    rc = f(cpu.ptr(dy), dy.stride(0), cpu.ptr(x), x.stride(0), cpu.ptr(dx), M, N, kind, dt,
           cpu.use_nt(dx), nth)
    cpu.check_rc(rc, "activation backward")
    return dx


def gated_forward(kind: int, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    M, N = gate.shape
    out = new_output((M, N), gate.dtype, gate.device)
    if out.numel() == 0:
        return out
    f = cpu.declare(_lib(), "tsr_glu_fwd", "plplplliiii")
    dt, nth = _common(gate)
    rc = f(cpu.ptr(gate), gate.stride(0), cpu.ptr(up), up.stride(0), cpu.ptr(out), M, N, kind, dt,
           cpu.use_nt(out), nth)
    cpu.check_rc(rc, "gated activation forward")
    return out


def gated_backward(kind: int, dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor):
    M, N = gate.shape
    dgate = new_output((M, N), gate.dtype, gate.device)
    dup = new_output((M, N), gate.dtype, gate.device)
    if dgate.numel() == 0:
        return dgate, dup
    f = cpu.declare(_lib(), "tsr_glu_bwd", "plplplpplliiii")
    dt, nth = _common(gate)
    rc = f(cpu.ptr(dy), dy.stride(0), cpu.ptr(gate), gate.stride(0), cpu.ptr(up), up.stride(0),
           cpu.ptr(dgate), cpu.ptr(dup), M, N, kind, dt, cpu.use_nt(dgate), nth)
    cpu.check_rc(rc, "gated activation backward")
    return dgate, dup
