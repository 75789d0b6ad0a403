"""GELU float64 reference, plain-PyTorch baseline, and the ``reference`` backend's kernels."""
from __future__ import annotations

import torch.nn.functional as F

from .._elementwise import gelu_kind
from .._elementwise import ref as _ref

DTYPES = _ref.DTYPES


def gelu_ref(x, approximate="none"):
    """Float64 reference of ``tessera.gelu`` (exact limits at +-inf)."""
    return _ref.act64(gelu_kind(approximate), x)


def gelu_eager(x, approximate="none"):
    """What a user writes in plain PyTorch, in the input dtype."""
    return F.gelu(x, approximate=approximate)


def forward(x, approximate):
    return _ref.unary_forward(gelu_kind(approximate), x)


def backward(dy, x, approximate):
    return _ref.unary_backward(gelu_kind(approximate), dy, x)
