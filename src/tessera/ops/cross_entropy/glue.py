"""Backend-independent glue of the cross-entropy kernel modules: target checks, the gradient
buffer, the reduction.

Every backend's kernel module (``ref.py``, ``cpu.py``, ``triton.py``) exports

* ``loss_rows(x, target, ignore_index, label_smoothing, z_loss, softcap, dx=None, scale=1.0,
  row_scale=None) -> (loss, lse)``: the kernel.  ``x`` is an (M, V) row view, ``target`` (M,)
  int64 contiguous and already checked (:func:`targets`); ``loss`` holds the M row losses (fp32,
  float64 on the reference backend) and ``lse`` the M log-sum-exps (fp32).  With ``dx`` (an
  (M, V) buffer with unit inner stride, or ``x`` itself: fused linear cross-entropy overwrites
  its logits chunk) it also writes d(row loss)/dx times ``scale`` (times ``row_scale[i]``, an
  fp32 (M,) tensor, when given) in the same pass.  The fused linear cross-entropy calls it chunk
  by chunk;
* ``forward(...)`` = :func:`forward` around its ``loss_rows``, and
* ``backward(d, g)``: ``d * g`` row by row (g fp32 (M,), stride 0 for a scalar).
"""
from __future__ import annotations

import torch

from ..._library import contiguous, new_output

REDUCTIONS = ("none", "mean", "sum")


def targets(op: str, target: torch.Tensor, V: int, ignore_index: int, count=None) -> tuple[torch.Tensor, int]:
    """(targets as (M,) contiguous int64, number of non-ignored rows); raises a ValueError naming
    'target' when a non-ignored target is outside [0, V) (no kernel ever reads such an index).
    ``count(t, V, ignore_index)``: a backend's native check and count of contiguous int64 targets
    (None when one is out of range); the torch ops below then run only to name the bad value."""
    t = target.reshape(-1)
    if count is not None and t.dtype == torch.int64 and t.is_contiguous():
        n = count(t, V, ignore_index)
        if n is not None:
            return t, n
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"tessera.{op}: argument 'target' (shape={tuple(target.shape)} dtype={target.dtype}) "
                         f"holds {int(t[i])} at flat position {i}; expected class indices in [0, {V}) "
                         f"or ignore_index={ignore_index}")
    n_valid = int(valid.sum())
    if t.dtype != torch.int64:
        t64 = new_output(t.shape, torch.int64, t.device)
        t64.copy_(t)
        return t64, n_valid
    return contiguous(t), n_valid


def grad_scale(reduction: str, n_valid: int) -> float:
    """The reduction's factor in d(loss)/d(row loss): 1/n for a mean (1 when n = 0: every row is
    ignored and every gradient row is 0), 1 otherwise."""
    return 1.0 / max(n_valid, 1) if reduction == "mean" else 1.0


def reduce(loss: torch.Tensor, reduction: str, n_valid: int, dtype: torch.dtype) -> torch.Tensor:
    """Row losses (fp32, or float64 from the reference) -> the op's loss in the logits dtype,
    rounded once.  A mean over no rows is 0 / 0 = NaN, as ``F.cross_entropy``."""
    if reduction == "none":
        return loss if loss.dtype == dtype else loss.to(dtype)
    total = loss.sum()
    if reduction == "mean":  # (in place: the sum is a fresh tensor; a tiny call feels each op)
        total = total.div_(n_valid) if n_valid else total.mul_(float("nan"))
    return total if total.dtype == dtype else total.to(dtype)


def forward(loss_rows, x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad, count=None):
    """-> (loss in x's dtype, lse fp32 (M,), the gradient rows for the reduction or None)."""
    M, V = x.shape
    t, n_valid = targets("cross_entropy", target, V, ignore_index, count)
    dx = new_output((M, V), x.dtype, x.device) if want_grad else None
    loss, lse = loss_rows(x, t, ignore_index, label_smoothing, z_loss, softcap, dx, grad_scale(reduction, n_valid))
    return reduce(loss, reduction, n_valid, x.dtype), lse, dx
