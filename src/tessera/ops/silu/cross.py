"""SiLU launcher of the edge-CPU backends (kernel: ops/_elementwise/activations.c in the remote runner)."""
from __future__ import annotations

from .._elementwise import SILU
from .._elementwise import cross as _k

DTYPES = _k.DTYPES


def forward(x):
    return _k.unary_forward(SILU, x)


def backward(dy, x):
    return _k.unary_backward(SILU, dy, x)
