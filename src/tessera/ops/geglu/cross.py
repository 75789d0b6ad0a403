"""GeGLU launcher of the edge-CPU backends (kernel: ops/_elementwise/activations.c in the remote runner)."""
from __future__ import annotations

from .._elementwise import gelu_kind
from .._elementwise import cross as _k

DTYPES = _k.DTYPES


def forward(gate, up, approximate):
    return _k.gated_forward(gelu_kind(approximate), gate, up)


def backward(dy, gate, up, approximate):
    return _k.gated_backward(gelu_kind(approximate), dy, gate, up)
