"""SwiGLU launcher of the edge-CPU backends (kernel: ops/_elementwise/activations.c in the remote runner)."""
from __future__ import annotations

from .._elementwise import SILU
from .._elementwise import cross as _k

DTYPES = _k.DTYPES


def forward(gate, up):
    return _k.gated_forward(SILU, gate, up)


def backward(dy, gate, up):
    return _k.gated_backward(SILU, dy, gate, up)
