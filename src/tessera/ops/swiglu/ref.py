"""SwiGLU float64 reference, plain-PyTorch baseline, and the ``reference`` backend's kernels."""
from __future__ import annotations

import torch.nn.functional as F

from .._elementwise import SILU
from .._elementwise import ref as _ref

DTYPES = _ref.DTYPES


def swiglu_ref(gate, up):
    """Float64 reference of ``tessera.swiglu`` (exact silu limits at +-inf)."""
    return _ref.act64(SILU, gate) * _ref.up(up)


def swiglu_eager(gate, up):
    """What a user writes in plain PyTorch, in the input dtype."""
    return F.silu(gate) * up


def forward(gate, up):
    return _ref.gated_forward(SILU, gate, up)


def backward(dy, gate, up):
    return _ref.gated_backward(SILU, dy, gate, up)
