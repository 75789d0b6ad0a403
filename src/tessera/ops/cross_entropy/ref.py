"""Cross-entropy float64 reference, the plain-PyTorch baseline, and the ``reference`` backend's
kernels.

    z    = softcap * tanh(x / softcap)   (softcap > 0; else z = x)
    lse  = logsumexp(z)
    loss = (1 - ls) (lse - z_t) + ls (lse - mean(z)) + z_loss lse^2      per non-ignored row
    mean = sum(loss) / #non-ignored rows  (0 / 0 = NaN when every row is ignored, as torch)

``(1 - ls) (lse - z_t) + ls (lse - mean(z))`` is ``F.cross_entropy``'s label smoothing: the
smoothed target puts ``ls / V`` on every class and ``1 - ls`` more on the target.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._library import new_output
from ...backends.reference import up
from . import glue

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _capped(z, softcap):
    return softcap * torch.tanh(z / softcap) if softcap > 0 else z


def _reduce64(loss, valid, reduction):
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / valid.sum()


def cross_entropy_ref(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=0.0,
                      reduction="mean", return_lse=False):
    """Float64 reference of ``tessera.cross_entropy`` (differentiable; returns float64)."""
    z = _capped(up(logits), softcap)
    lse_out = torch.logsumexp(z, -1)
    valid = target != ignore_index
    # an ignored row contributes 0 and gets a zero gradient whatever its logits hold (all -inf
    # included, where logsumexp's own gradient is NaN): its loss is computed from zeros
    z = torch.where(valid.unsqueeze(-1), z, torch.zeros_like(z))
    lse = torch.logsumexp(z, -1)
    t = torch.where(valid, target, torch.zeros_like(target)).long()
    zt = z.gather(-1, t.unsqueeze(-1)).squeeze(-1)
    loss = (1 - label_smoothing) * (lse - zt)
    if label_smoothing > 0:
        loss = loss + label_smoothing * (lse - z.mean(-1))
    if z_loss > 0:
        loss = loss + z_loss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    out = _reduce64(loss, valid, reduction)
    return (out, lse_out) if return_lse else out


def cross_entropy_eager(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=0.0,
                        reduction="mean", return_lse=False):
    """What a user writes in plain PyTorch, in the input dtype: the capped logits, then
    ``F.cross_entropy`` (fp32 statistics inside for fp16/bf16), plus the z-loss from
    ``torch.logsumexp``."""
    z = softcap * torch.tanh(logits / softcap) if softcap > 0 else logits
    target = target.long()
    loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), target.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=label_smoothing)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    lse = torch.logsumexp(z, -1)
    if z_loss > 0:
        valid = target != ignore_index
        zl = torch.where(valid, z_loss * lse * lse, torch.zeros_like(lse))
        if reduction == "none":
            loss = loss + zl
        elif reduction == "sum":
            loss = loss + zl.sum()
        else:
            loss = loss + zl.sum() / valid.sum()
    return (loss, lse.float()) if return_lse else loss


# ---------------------------------------------------------------- closed form (float64)

def rows64(z, target, ignore_index, label_smoothing, z_loss, softcap, want_grad):
    """Row losses, lse and (want_grad) d(row loss)/d(logits), all float64, for (M, V) logits and
    (M,) targets (checked in range): the closed-form gradient the matrix checks against
    autograd through :func:`cross_entropy_ref`.  Also the fused linear cross-entropy's
    reference backend."""
    x = up(z)
    zc = _capped(x, softcap)
    M, V = x.shape
    lse = torch.logsumexp(zc, -1)
    valid = target != ignore_index
    t = torch.where(valid, target, torch.zeros_like(target)).long()
    zt = zc.gather(-1, t.unsqueeze(-1)).squeeze(-1)
    loss = (1 - label_smoothing) * (lse - zt)
    if label_smoothing > 0:
        loss = loss + label_smoothing * (lse - zc.mean(-1))
    if z_loss > 0:
        loss = loss + z_loss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if not want_grad:
        return loss, lse, None
    p = torch.exp(zc - lse[:, None])
    g = p * (1 + 2 * z_loss * lse)[:, None] - label_smoothing / V
    g.scatter_add_(1, t.unsqueeze(1), torch.full((M, 1), -(1 - label_smoothing), dtype=g.dtype))
    if softcap > 0:
        g = g * (1 - (zc / softcap) ** 2)
    g = torch.where(valid[:, None], g, torch.zeros_like(g))
    return loss, lse, g


# ---------------------------------------------------------------- reference backend kernels

def loss_rows(x, target, ignore_index, label_smoothing, z_loss, softcap, dx=None, scale=1.0, row_scale=None):
    """The kernel contract (see glue.py): float64 math; row losses stay float64 for the
    reduction, the gradient rows are cast into ``dx`` (which may be ``x``)."""
    loss, lse, g = rows64(x, target, ignore_index, label_smoothing, z_loss, softcap, dx is not None)
    if dx is not None:
        g = g * scale
        if row_scale is not None:
            g = g * up(row_scale)[:, None]
        dx.copy_(g)
    return loss, lse.to(torch.float32)


def forward(x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad):
    return glue.forward(loss_rows, x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad)


def backward(d, g):
    """dx = d * g per row (g: fp32, one value per row, stride 0 for a scalar), in float64."""
    dx = new_output(d.shape, d.dtype, d.device)
    dx.copy_(up(d) * up(g)[:, None])
    return dx
