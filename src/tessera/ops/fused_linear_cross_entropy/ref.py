"""Fused linear cross-entropy float64 reference, the plain-PyTorch baseline, and the
``reference`` backend's kernels (closed form in float64, no chunking: the reference is for
checking, not for memory).

    loss = cross_entropy(hidden @ weight.T + bias, target, ...)     (tessera.cross_entropy's math)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends.reference import up
from ..cross_entropy import glue
from ..cross_entropy.ref import cross_entropy_eager, cross_entropy_ref, rows64

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OP = "fused_linear_cross_entropy"


def fused_linear_cross_entropy_ref(hidden, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                                   z_loss=0.0, softcap=0.0, reduction="mean"):
    """Float64 reference (differentiable; returns float64)."""
    logits = F.linear(up(hidden), up(weight), up(bias))
    return cross_entropy_ref(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction)


def fused_linear_cross_entropy_eager(hidden, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                                     z_loss=0.0, softcap=0.0, reduction="mean"):
    """What a user writes in plain PyTorch: ``F.linear`` (the full logits) then the loss."""
    return cross_entropy_eager(F.linear(hidden, weight, bias), target, ignore_index, label_smoothing, z_loss,
                               softcap, reduction)


# ---------------------------------------------------------------- reference backend kernels

def _grads64(h64, w64, g, need_dh, need_dw, need_db, dtype):
    dh = (g @ w64).to(dtype) if need_dh else None
    dw = (g.T @ h64).to(dtype) if need_dw else None
    db = g.sum(0).to(dtype) if need_db else None
    return dh, dw, db


def _logits64(hidden, weight, bias):
    h64, w64 = up(hidden).reshape(-1, hidden.shape[-1]), up(weight)
    z = h64 @ w64.T
    return (z if bias is None else z + up(bias)), h64, w64


def forward(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction,
            need_dh, need_dw, need_db):
    """The kernel contract of chunks.py: (loss in hidden's dtype, dh, dw, db), the gradients (for
    the reduction, upstream gradient 1) only for mean/sum and only those asked for."""
    t, n_valid = glue.targets(OP, target, weight.shape[0], ignore_index)
    grads = reduction != "none" and (need_dh or need_dw or need_db)
    z, h64, w64 = _logits64(hidden, weight, bias)
    loss, _, g = rows64(z, t, ignore_index, label_smoothing, z_loss, softcap, grads)
    out = glue.reduce(loss, reduction, n_valid, hidden.dtype)
    if not grads:
        return out, None, None, None
    g = g * glue.grad_scale(reduction, n_valid)
    return (out, *_grads64(h64, w64, g, need_dh, need_dw, need_db, hidden.dtype))


def backward(grad, dh, dw, db, hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
             reduction, need_dh, need_dw, need_db):
    """mean/sum: the saved gradients times the scalar upstream gradient; none: recomputed with
    the upstream gradient of each row."""
    if reduction != "none":
        g = up(grad)
        return tuple(None if d is None else (up(d) * g).to(d.dtype) for d in (dh, dw, db))
    t, _ = glue.targets(OP, target, weight.shape[0], ignore_index)
    z, h64, w64 = _logits64(hidden, weight, bias)
    _, _, g = rows64(z, t, ignore_index, label_smoothing, z_loss, softcap, True)
    g = g * up(grad).reshape(-1, 1)
    return _grads64(h64, w64, g, need_dh, need_dw, need_db, hidden.dtype)
