"""GELU native CPU launcher (kernel: ops/_elementwise/activations.c)."""
from __future__ import annotations

from .._elementwise import gelu_kind
from .._elementwise import cpu as _k

DTYPES = _k.DTYPES


def forward(x, approximate):
    return _k.unary_forward(gelu_kind(approximate), x)


def backward(dy, x, approximate):
    return _k.unary_backward(gelu_kind(approximate), dy, x)
