"""Cross-entropy loss with label smoothing, z-loss and logit softcap (``tessera.cross_entropy``).

    z    = softcap * tanh(logits / softcap)            (softcap > 0, Gemma 2; 0 disables)
    lse  = logsumexp(z, -1)
    loss = (1 - ls) (lse - z_t) + ls (lse - mean(z)) + z_loss * lse^2      per non-ignored row
    reduction: "none" (per row, target's shape), "sum", "mean" (sum / number of non-ignored rows)

Semantics follow ``F.cross_entropy`` for ``ignore_index``, ``label_smoothing`` and ``reduction``
(class-index targets, no class weights): an ignored row contributes 0 and is not counted; a mean
over zero non-ignored rows (all ignored, or no rows) is NaN as in torch, and its gradient is 0.
``z_loss`` is PaLM's auxiliary term (z_loss * lse^2 per non-ignored row, added to the loss and
reduced with it).  ``logits`` (..., V) is fp32/fp16/bf16 in any layout (leading dims are
flattened to rows); ``target`` (...) is int64 or int32.  A target outside [0, V) that is not
``ignore_index`` raises a ValueError (checked on the target tensor before any kernel runs).
The loss has the logits' dtype (as ``F.cross_entropy``), reduced in fp32 and rounded once;
with ``return_lse=True`` the per-row log-sum-exp of the (capped) logits comes back too, fp32 in
the target's shape.  It is not differentiable (marked so, like attention's lse).

Gradient in the forward (Liger's design): when ``logits`` requires grad, the forward kernel
writes d(loss)/d(logits) in the same pass that computes the loss (one read of the logits per
row: online log-sum-exp, then the gradient from the cache-resident row), pre-scaled by the
reduction (1/n for a mean).  Backward only multiplies it by the upstream gradient: a scalar for
mean/sum, one value per row for reduction="none" (the case Liger's users found wrong), through
``tessera::cross_entropy_backward``.  A plain eager ``loss.backward()`` (upstream gradient exactly
1 for mean/sum) returns the saved gradient itself, with no copy.  Without grad the gradient is
neither allocated nor written.  Kernels: glue.py (contract and glue), cross_entropy.c, triton.py,
ref.py.

Roofline: the forward reads the logits once (the gradient, when wanted, is one write more); FLOPs
~5 per logit (max, subtract, exp, add; the gradient pass 2 more).  ``tessera bench`` times the
loss-only forward; the fwd + bwd figures with the gradient are in ``tessera.bench.loss_memory``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct, rows, shaped
from ..._registry import OpSpec, register_op, select
from . import spec as _spec
from .ref import cross_entropy_eager, cross_entropy_ref
from .glue import REDUCTIONS

OP = "cross_entropy"
INDEX_DTYPES = (torch.int64, torch.int32)


def loss_option_types(op, ignore_index, reduction) -> None:
    """Python types of the non-float options (the public functions, before the schema parser;
    the floats go through ``_checks.python_types``).  Traceable: values are checked in the op."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, torch.SymInt)):
        raise TypeError(f"tessera.{op}: argument 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    if not isinstance(reduction, str):
        raise TypeError(f"tessera.{op}: argument 'reduction' must be a str, got {type(reduction).__name__}")


def check_loss_options(op, ignore_index, label_smoothing, z_loss, softcap, reduction) -> None:
    """The options shared with fused_linear_cross_entropy (types and values, inside the op)."""
    loss_option_types(op, ignore_index, reduction)
    ls = _checks.finite_float(op, "label_smoothing", label_smoothing, min_value=0.0)
    if ls > 1.0:
        raise ValueError(f"tessera.{op}: argument 'label_smoothing'={ls} must be in [0, 1]")
    _checks.finite_float(op, "z_loss", z_loss, min_value=0.0)
    _checks.finite_float(op, "softcap", softcap, min_value=0.0)
    _checks.choice(op, "reduction", reduction, REDUCTIONS)


def check_target(op, target, lead_name, lead) -> None:
    _checks.tensor(op, "target", target, dtypes=INDEX_DTYPES, min_dim=0)
    if target.shape != lead.shape[:-1]:
        raise ValueError(f"tessera.{op}: argument 'target' ({_checks.describe(target)}) must have the shape "
                         f"{tuple(lead.shape[:-1])} (the leading dims of '{lead_name}' {tuple(lead.shape)})")


def _check(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction):
    _checks.tensor(OP, "logits", logits)
    if logits.shape[-1] == 0:
        raise ValueError(f"tessera.{OP}: argument 'logits' ({_checks.describe(logits)}) must have a non-empty "
                         "last (class) dimension")
    check_target(OP, target, "logits", logits)
    _checks.same_device(OP, "logits", logits, target=target)
    check_loss_options(OP, ignore_index, label_smoothing, z_loss, softcap, reduction)


def _cross_entropy_impl(logits: Tensor, target: Tensor, ignore_index: int, label_smoothing: float,
                        z_loss: float, softcap: float, reduction: str, want_grad: bool,
                        backend: str) -> tuple[Tensor, Tensor, Tensor]:
    _check(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction)
    mod = select(SPEC, logits.device, logits.dtype, backend)
    loss, lse, d = mod.forward(rows(logits), target, ignore_index, label_smoothing, z_loss, softcap,
                               reduction, want_grad)
    if reduction == "none":
        loss = shaped(loss, target.shape)
    d = logits.new_empty(0) if d is None else shaped(d, logits.shape)
    return loss, shaped(lse, target.shape), d


_cross_entropy = torch.library.custom_op("tessera::cross_entropy", mutates_args=())(_cross_entropy_impl)


@_cross_entropy.register_fake
def _(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad, backend):
    _check(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction)
    loss = logits.new_empty(target.shape if reduction == "none" else ())
    d = logits.new_empty(logits.shape) if want_grad else logits.new_empty(0)
    return loss, logits.new_empty(target.shape, dtype=torch.float32), d


def row_grad(grad: Tensor, M: int) -> Tensor:
    """The upstream gradient as fp32, one value per row: stride 0 for a scalar (mean/sum)."""
    g = grad.reshape(-1).to(torch.float32)
    if g.numel() == 1:
        return g.expand(M)
    if g.numel() != M:
        raise ValueError(f"tessera.{OP}: the loss gradient ({_checks.describe(grad)}) must have 1 or {M} elements")
    return contiguous(g)


def _cross_entropy_backward_impl(grad: Tensor, d: Tensor, backend: str) -> Tensor:
    mod = select(SPEC, d.device, d.dtype, backend)
    dr = rows(d)
    return shaped(mod.backward(dr, row_grad(grad, dr.shape[0])), d.shape)


_cross_entropy_backward = torch.library.custom_op("tessera::cross_entropy_backward", mutates_args=())(
    _cross_entropy_backward_impl)


@_cross_entropy_backward.register_fake
def _(grad, d, backend):
    return d.new_empty(d.shape)


def upstream_is_one(op, impl, grad: Tensor, *saved) -> bool:
    """A plain eager backward whose upstream gradient is exactly 1 (``loss.backward()`` of a
    mean/sum): the saved gradient is the answer, returned without a copy.  Anything a tracer,
    mode or subclass could see keeps the custom op (``_library.direct`` decides)."""
    return direct(op, impl, grad, *saved) is impl and grad.numel() == 1 and bool(grad == 1)


def _setup(ctx, inputs, output):
    ctx.reduction, ctx.want_grad, ctx.backend = inputs[6], inputs[7], inputs[8]
    _, lse, d = output
    ctx.mark_non_differentiable(lse, d)
    ctx.set_materialize_grads(False)  # no zero "gradients" for lse and the logits-sized d
    ctx.save_for_backward(d)


def _backward(ctx, dloss, _dlse, _dd):
    (d,) = ctx.saved_tensors
    if dloss is None:  # the loss itself did not reach the output being differentiated
        return (None,) * 9
    if not ctx.want_grad:
        raise RuntimeError(f"tessera.{OP}: the forward was called with want_grad=False, so no gradient was "
                           "saved; call tessera.cross_entropy (it decides) instead of the raw custom op")
    if ctx.reduction != "none" and upstream_is_one(_cross_entropy_backward, _cross_entropy_backward_impl, dloss, d):
        dx = d
    else:
        dx = _cross_entropy_backward(dloss, d, ctx.backend)
    return dx, None, None, None, None, None, None, None, None


_cross_entropy.register_autograd(_backward, setup_context=_setup)


def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  z_loss: float = 0.0, softcap: float = 0.0, reduction: str = "mean", return_lse: bool = False,
                  *, backend: Optional[str] = None):
    """Cross-entropy of ``logits`` (..., V) against class indices ``target`` (...); with
    ``return_lse``, returns ``(loss, lse)`` (lse: fp32, not differentiable)."""
    f = direct(_cross_entropy, _cross_entropy_impl, logits, target)
    if f is _cross_entropy or target is None:  # before the schema parser (the body checks for itself)
        _checks.python_types(OP, {"logits": logits, "target": target},
                             {"label_smoothing": label_smoothing, "z_loss": z_loss, "softcap": softcap})
        if not isinstance(target, Tensor):
            raise TypeError(f"tessera.{OP}: argument 'target' must be a torch.Tensor, got {type(target).__name__}")
        loss_option_types(OP, ignore_index, reduction)
    # (the direct path runs only when nothing needs a gradient)
    want_grad = f is _cross_entropy and torch.is_grad_enabled() and logits.requires_grad
    loss, lse, _ = f(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad,
                     _checks.backend_arg(OP, backend))
    return (loss, lse) if return_lse else loss


SPEC = register_op(OpSpec(
    name=OP, fn=cross_entropy, ref=cross_entropy_ref, eager=cross_entropy_eager,
    kernels={"reference": "tessera.ops.cross_entropy.ref", "cpu": "tessera.ops.cross_entropy.cpu",
             "triton": "tessera.ops.cross_entropy.triton"},
    cases=_spec.cases(), grad_inputs=("logits",),
    bytes_fwd=_spec.bytes_fwd, flops_fwd=_spec.flops_fwd,
    bench_cases=_spec.bench_cases(),
    out_dtypes={1: torch.float32},
    fuzz="test_cross_entropy.py",
))
