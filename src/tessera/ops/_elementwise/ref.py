"""Float64 math of the activation family, and the ``reference`` backend's kernels.

``act64`` is the float64 reference of every op in the family (the test matrix
differentiates it with autograd); ``grad64`` is the closed-form derivative the
reference backend's backward uses, written out independently so the matrix checks
one against the other.

Limits at +-inf are the mathematical ones: act(-inf) = 0, act(+inf) = +inf,
act'(-inf) = 0, act'(+inf) = 1 (plain PyTorch returns NaN for some of them, e.g.
``F.gelu(inf)`` and ``F.silu(-inf)``).  NaN propagates.
"""
from __future__ import annotations

import math

import torch

from ...backends.reference import up
from . import GELU, GELU_TANH, SILU

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_K = 0.044715


def _core(kind: int, x: torch.Tensor) -> torch.Tensor:
    """act on finite float64 x, differentiable."""
    if kind == SILU:
        return x * torch.sigmoid(x)
    if kind == GELU:
        # Phi(x) = erfc(-x / sqrt2) / 2: no 1 + erf cancellation for negative x
        return 0.5 * x * torch.special.erfc(-x * math.sqrt(0.5))
    if kind == GELU_TANH:
        # 0.5 x (1 + tanh u) == x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
        return x * torch.sigmoid(2.0 * _SQRT_2_OVER_PI * (x + _TANH_K * x ** 3))
    raise ValueError(f"unknown activation kind {kind}")


def act64(kind: int, x: torch.Tensor) -> torch.Tensor:
    """act(x) in float64 with the +-inf limits, differentiable (autograd gives 1 / 0 there).

    The infinite positions are computed by relu (value and derivative are the limits)
    and the formula sees 0 in their place, so no inf * 0 reaches autograd either.
    """
    x = up(x)
    inf = torch.isinf(x)
    y = _core(kind, torch.where(inf, torch.zeros_like(x), x))
    return torch.where(inf, torch.relu(x), y)


def grad64(kind: int, x: torch.Tensor) -> torch.Tensor:
    """act'(x) in float64, closed form.

    x is clamped to +-1e6 first: beyond that every act' equals its limit exactly in
    float64 (sigmoid(-1e6) and exp(-5e11) are 0), and the clamp keeps x^2, x^3 and
    x * (1 - s) finite.  clamp keeps NaN.
    """
    x = up(x).clamp(-1e6, 1e6)
    if kind == SILU:
        s, s1m = torch.sigmoid(x), torch.sigmoid(-x)   # 1 - s without cancellation
        return s * (1.0 + x * s1m)
    if kind == GELU:
        phi = torch.exp(-0.5 * x * x) * _INV_SQRT_2PI
        return 0.5 * torch.special.erfc(-x * math.sqrt(0.5)) + x * phi
    if kind == GELU_TANH:
        z = 2.0 * _SQRT_2_OVER_PI * (x + _TANH_K * x ** 3)
        dz = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _TANH_K * x * x)
        s, s1m = torch.sigmoid(z), torch.sigmoid(-z)
        return s + x * s * s1m * dz
    raise ValueError(f"unknown activation kind {kind}")


# ---------------------------------------------------------------- reference backend kernels
# Row views in, contiguous outputs in the input dtype; the math runs in float64.

def unary_forward(kind: int, x: torch.Tensor) -> torch.Tensor:
    return act64(kind, x).to(x.dtype).contiguous()


def unary_backward(kind: int, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (up(dy) * grad64(kind, x)).to(x.dtype).contiguous()


def gated_forward(kind: int, gate: torch.Tensor, up_: torch.Tensor) -> torch.Tensor:
    return (act64(kind, gate) * up(up_)).to(gate.dtype).contiguous()


def gated_backward(kind: int, dy: torch.Tensor, gate: torch.Tensor, up_: torch.Tensor):
    dy64 = up(dy)
    dgate = dy64 * up(up_) * grad64(kind, gate)
    dup = dy64 * act64(kind, gate)
    return dgate.to(gate.dtype).contiguous(), dup.to(gate.dtype).contiguous()
