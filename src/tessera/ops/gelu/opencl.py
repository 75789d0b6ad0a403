"""GELU OpenCL launcher (kernel: ops/_elementwise/activations.cl)."""
from __future__ import annotations

from .._elementwise import gelu_kind
from .._elementwise import opencl as _k

DTYPES = _k.DTYPES


def forward(x, approximate):
    return _k.unary_forward(gelu_kind(approximate), x)


def backward(dy, x, approximate):
    return _k.unary_backward(gelu_kind(approximate), dy, x)
