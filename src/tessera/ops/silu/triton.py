"""SiLU Triton launcher (kernel: ops/_elementwise/triton.py)."""
from __future__ import annotations

from .._elementwise import SILU
from .._elementwise import triton as _k

DTYPES = _k.DTYPES


def forward(x):
    return _k.unary_forward(SILU, x)


def backward(dy, x):
    return _k.unary_backward(SILU, dy, x)
