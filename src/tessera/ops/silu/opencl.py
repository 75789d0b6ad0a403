"""SiLU OpenCL launcher (kernel: ops/_elementwise/activations.cl)."""
from __future__ import annotations

from .._elementwise import SILU
from .._elementwise import opencl as _k

DTYPES = _k.DTYPES


def forward(x):
    return _k.unary_forward(SILU, x)


def backward(dy, x):
    return _k.unary_backward(SILU, dy, x)
