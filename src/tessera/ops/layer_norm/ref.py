"""LayerNorm float64 reference, and the ``reference`` backend's kernels for it.

    h = x + residual (if given);  y = (h - mean(h)) / sqrt(var(h) + eps) * weight + bias

``var`` is the biased (population) variance over the last dim, as in
``torch.nn.functional.layer_norm``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends.reference import up

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def layer_norm_ref(x, weight=None, bias=None, eps=1e-5, residual=None):
    """Float64 reference of ``tessera.layer_norm`` (returns float64)."""
    h = up(x) if residual is None else up(x) + up(residual)
    mean = h.mean(-1, keepdim=True)
    d = h - mean
    y = d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * up(weight)
    if bias is not None:
        y = y + up(bias)
    return y if residual is None else (y, h)


def layer_norm_eager(x, weight=None, bias=None, eps=1e-5, residual=None):
    """What a user writes in plain PyTorch, in the input dtype (the 2x-rule and bench baseline)."""
    h = x if residual is None else x + residual
    y = F.layer_norm(h, (h.shape[-1],), weight, bias, eps)
    return y if residual is None else (y, h)


# ---------------------------------------------------------------- reference backend kernels

def forward(x, weight, bias, residual, eps):
    h64 = up(x) if residual is None else up(x) + up(residual)
    h = None if residual is None else h64.to(x.dtype)
    hn = h64 if h is None else up(h)  # normalise the rounded h, as every backend does
    mean = hn.mean(-1)
    d = hn - mean[:, None]
    rstd = torch.rsqrt(d.pow(2).mean(-1) + eps)
    y = d * rstd[:, None]
    if weight is not None:
        y = y * up(weight)
    if bias is not None:
        y = y + up(bias)
    return y.to(x.dtype), h, mean.to(torch.float32), rstd.to(torch.float32)


def backward(dy, dh, h, weight, bias, mean, rstd, eps):
    """Closed form, with xhat = (h - mean) * rstd and g = dy * w:

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh_out
        dw = sum_rows dy * xhat,   db = sum_rows dy

    mean and rstd are recomputed in float64 from h (the saved fp32 ones are for the
    fast backends); ``bias`` only says whether db is wanted.
    """
    h64, dy64 = up(h), up(dy)
    mu = h64.mean(-1, keepdim=True)
    d = h64 - mu
    r = torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    xhat = d * r
    g = dy64 * up(weight) if weight is not None else dy64
    dx = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    if dh is not None:
        dx = dx + up(dh)
    dw = None if weight is None else (dy64 * xhat).sum(0).to(torch.float32)
    db = None if bias is None else dy64.sum(0).to(torch.float32)
    return dx.to(h.dtype), dw, db
