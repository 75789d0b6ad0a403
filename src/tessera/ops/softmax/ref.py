"""Softmax float64 reference, and the ``reference`` backend's kernels for it.

    y = exp(x - max(x)) / sum(exp(x - max(x)))        along ``dim``

Special rows (every backend follows these; they are the op's contract):

* a row that is entirely ``-inf`` (fully masked) gives all zeros, never NaN:
  the max is replaced by 0, every exp is 0, and the sum 0 is replaced by 1;
* a row containing ``+inf`` or NaN gives NaN in every position.  This is the
  IEEE result (``inf - inf`` is undefined) and what ``torch.softmax`` returns;
  we keep it rather than inventing a limit (e.g. 1/k on the k ``+inf``
  entries), so that a poisoned row stays visibly poisoned;
* ``-inf`` entries of any other row give exactly 0 (and zero gradient).

Backward, with the saved output y:  dx = y * (dy - sum(dy * y)).
"""
from __future__ import annotations

import torch

from ..._library import new_output
from ...backends.reference import up

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def softmax_ref(x, dim=-1):
    """Float64 reference of ``tessera.softmax`` (returns float64); differentiable."""
    x = up(x)
    if x.numel() == 0:
        return x.clone()  # amax rejects an empty reduction dim; nothing to normalise
    # The shift does not change the result, so it carries no gradient (detach keeps
    # float64 autograd from adding a rounding-noise term through amax).
    m = x.amax(dim, keepdim=True).detach()
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)   # fully masked row: shift by 0
    e = torch.exp(x - m)
    s = e.sum(dim, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)         # ... and 0 / 1 = 0


def softmax_eager(x, dim=-1):
    """What a user writes in plain PyTorch, in the input dtype (the 2x-rule and bench baseline)."""
    return torch.softmax(x, dim)


# ---------------------------------------------------------------- reference backend kernels

def forward(x):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    y.copy_(softmax_ref(x, -1))
    return y


def backward(dy, y):
    """dx = y * (dy - sum(dy * y)), in float64 from the saved (rounded) output."""
    M, N = y.shape
    y64, dy64 = up(y), up(dy)
    dx = new_output((M, N), y.dtype, y.device)
    dx.copy_(y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True)))
    return dx
