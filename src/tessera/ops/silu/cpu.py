"""SiLU native CPU launcher (kernel: ops/_elementwise/activations.c)."""
from __future__ import annotations

from .._elementwise import SILU
from .._elementwise import cpu as _k

DTYPES = _k.DTYPES


def forward(x):
    return _k.unary_forward(SILU, x)


def backward(dy, x):
    return _k.unary_backward(SILU, dy, x)
