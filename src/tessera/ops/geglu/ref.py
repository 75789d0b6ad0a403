"""GeGLU float64 reference, plain-PyTorch baseline, and the ``reference`` backend's kernels."""
from __future__ import annotations

import torch.nn.functional as F

from .._elementwise import gelu_kind
from .._elementwise import ref as _ref

DTYPES = _ref.DTYPES


def geglu_ref(gate, up, approximate="none"):
    """Float64 reference of ``tessera.geglu`` (exact gelu limits at +-inf)."""
    return _ref.act64(gelu_kind(approximate), gate) * _ref.up(up)


def geglu_eager(gate, up, approximate="none"):
    """What a user writes in plain PyTorch, in the input dtype."""
    return F.gelu(gate, approximate=approximate) * up


def forward(gate, up, approximate):
    return _ref.gated_forward(gelu_kind(approximate), gate, up)


def backward(dy, gate, up, approximate):
    return _ref.gated_backward(gelu_kind(approximate), dy, gate, up)
