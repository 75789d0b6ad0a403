"""RMSNorm float64 reference, and the ``reference`` backend's kernels for it.

    h = x + residual (if given);  y = h / sqrt(mean(h^2, -1) + eps) * weight
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends.reference import up

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rms_norm_ref(x, weight=None, eps=1e-6, residual=None):
    """Float64 reference of ``tessera.rms_norm`` (returns float64)."""
    h = up(x) if residual is None else up(x) + up(residual)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * up(weight)
    return y if residual is None else (y, h)


def rms_norm_eager(x, weight=None, eps=1e-6, residual=None):
    """What a user writes in plain PyTorch, in the input dtype (the 2x-rule and bench baseline):
    ``F.rms_norm``, which keeps its statistics in fp32 for fp16/bf16 inputs as PyTorch's own
    norms do.  (The hand-written ``h * rsqrt(h.pow(2).mean(-1) + eps)`` squares in fp16, so rows
    near 65504 overflow to inf and come out as zeros: a baseline that broken made the 2x rule
    admit an all-zero output.)"""
    h = x if residual is None else x + residual
    y = F.rms_norm(h, (h.shape[-1],), weight, eps)
    return y if residual is None else (y, h)


# ---------------------------------------------------------------- reference backend kernels

def forward(x, weight, residual, eps):
    h64 = up(x) if residual is None else up(x) + up(residual)
    h = None if residual is None else h64.to(x.dtype)
    hn = h64 if h is None else up(h)  # normalise the rounded h, as every backend does
    ms = hn.pow(2).mean(-1)
    rstd = torch.rsqrt(ms + eps)
    y = hn * rstd[:, None]
    if weight is not None:
        y = y * up(weight)
    return y.to(x.dtype), h, rstd.to(torch.float32)


def backward(dy, dh, h, weight, rstd, eps):
    """dh = rstd * (g - xhat * mean(g * xhat)) + dh_out with g = dy * w, xhat = h * rstd; dw = sum dy * xhat."""
    h64, dy64 = up(h), up(dy)
    r = torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + eps)  # recomputed in float64
    xhat = h64 * r
    g = dy64 * up(weight) if weight is not None else dy64
    dx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    if dh is not None:
        dx = dx + up(dh)
    dw = None if weight is None else (dy64 * xhat).sum(0).to(torch.float32)
    return dx.to(h.dtype), dw
