"""GELU launcher of the edge-CPU backends (kernel: ops/_elementwise/activations.c in the remote runner)."""
from __future__ import annotations

from .._elementwise import gelu_kind
from .._elementwise import cross as _k

DTYPES = _k.DTYPES


def forward(x, approximate):
    return _k.unary_forward(gelu_kind(approximate), x)


def backward(dy, x, approximate):
    return _k.unary_backward(gelu_kind(approximate), dy, x)
