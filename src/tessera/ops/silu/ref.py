"""SiLU float64 reference, plain-PyTorch baseline, and the ``reference`` backend's kernels."""
from __future__ import annotations

import torch.nn.functional as F

from .._elementwise import SILU
from .._elementwise import ref as _ref

DTYPES = _ref.DTYPES


def silu_ref(x):
    """Float64 reference of ``tessera.silu`` (exact limits at +-inf)."""
    return _ref.act64(SILU, x)


def silu_eager(x):
    """What a user writes in plain PyTorch, in the input dtype."""
    return F.silu(x)


def forward(x):
    return _ref.unary_forward(SILU, x)


def backward(dy, x):
    return _ref.unary_backward(SILU, dy, x)
