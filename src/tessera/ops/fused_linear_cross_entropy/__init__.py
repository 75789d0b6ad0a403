"""The LM head and its loss without the logits (``tessera.fused_linear_cross_entropy``).

    loss = tessera.cross_entropy(hidden @ weight.T + bias, target, ignore_index, label_smoothing,
                                 z_loss, softcap, reduction)

``hidden`` (..., H), ``weight`` (V, H), ``bias`` (V,) or None, all of one float dtype;
``target`` (...) int64/int32.  The loss has hidden's dtype; options and semantics are
``tessera.cross_entropy``'s (including a NaN mean when every target is ignored).

The (tokens x V) logits are never materialised, in the forward or the backward: chunks.py
computes them a chunk of tokens at a time (at most 256 MiB of logits, see there), runs the
cross-entropy kernel of the selected backend on the chunk, which overwrites it with the
gradient, and folds that into dhidden / dweight / dbias (fp32 accumulators) before the next
chunk.  For reduction="mean"/"sum" all of this happens in the forward when any input requires
grad (Liger's design) and the backward only multiplies the three gradients by the scalar
upstream gradient (``tessera::fused_linear_cross_entropy_backward``; a plain ``loss.backward()``,
upstream gradient exactly 1, returns them without a copy).  For reduction="none" the forward
computes the losses only and the backward runs the chunk loop again with each row's upstream
gradient (one more logits GEMM, still no full logits).  Only the gradients of inputs that
require grad are computed: a frozen LM head (LoRA) skips the dweight GEMM entirely.

Backends: every backend with a cross-entropy kernel (cpu, triton: the same chunk loop around
it; reference: float64 closed form without chunks).  Peak memory and time against
``F.linear`` + ``F.cross_entropy``: ``python -m tessera.bench.loss_memory``.

Roofline: compute-bound, 2 T H V FLOPs for the logits (forward without grad), 6 T H V with the
gradients; bytes: hidden and weight read once per chunk.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, shaped
from ..._registry import OpSpec, register_op, select
from ..cross_entropy import check_loss_options, check_target, loss_option_types, upstream_is_one
from . import spec as _spec
from .ref import fused_linear_cross_entropy_eager, fused_linear_cross_entropy_ref

OP = "fused_linear_cross_entropy"


def _check(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction):
    _checks.tensor(OP, "hidden", hidden)
    if hidden.shape[-1] == 0:
        raise ValueError(f"tessera.{OP}: argument 'hidden' ({_checks.describe(hidden)}) must have a non-empty "
                         "last dimension")
    _checks.tensor(OP, "weight", weight)
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1] or weight.shape[0] == 0:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must be 2-D (V, "
                         f"{hidden.shape[-1]}) with V >= 1 (the last dimension of 'hidden' {tuple(hidden.shape)})")
    _checks.same_dtype(OP, "hidden", hidden, "weight", weight)
    check_target(OP, target, "hidden", hidden)
    if bias is not None:
        _checks.tensor(OP, "bias", bias)
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(f"tessera.{OP}: argument 'bias' ({_checks.describe(bias)}) must be 1-D of size "
                             f"{weight.shape[0]} (the rows of 'weight' {tuple(weight.shape)})")
        _checks.same_dtype(OP, "hidden", hidden, "bias", bias)
    _checks.same_device(OP, "hidden", hidden, weight=weight, target=target, bias=bias)
    check_loss_options(OP, ignore_index, label_smoothing, z_loss, softcap, reduction)


def _flce_impl(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], ignore_index: int,
               label_smoothing: float, z_loss: float, softcap: float, reduction: str, need_dhidden: bool,
               need_dweight: bool, need_dbias: bool, backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _check(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction)
    mod = select(SPEC, hidden.device, hidden.dtype, backend)
    loss, dh, dw, db = mod.forward(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
                                   reduction, need_dhidden, need_dweight, need_dbias)
    if reduction == "none":
        loss = shaped(loss, target.shape)
    def empty():  # one per absent gradient: outputs must not alias each other
        return hidden.new_empty(0)
    return (loss, empty() if dh is None else shaped(dh, hidden.shape), empty() if dw is None else dw,
            empty() if db is None else db)


_flce = torch.library.custom_op(f"tessera::{OP}", mutates_args=())(_flce_impl)


def _stored(reduction, need, like):
    """The fake of a gradient the forward stores: like's shape when computed, else empty."""
    return like.new_empty(like.shape) if need and reduction != "none" else like.new_empty(0)


@_flce.register_fake
def _(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction, need_dhidden,
      need_dweight, need_dbias, backend):
    _check(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction)
    loss = hidden.new_empty(target.shape if reduction == "none" else ())
    return (loss, _stored(reduction, need_dhidden, hidden), _stored(reduction, need_dweight, weight),
            _stored(reduction, need_dbias and bias is not None, weight if bias is None else bias))


def _flce_backward_impl(grad: Tensor, dhidden: Optional[Tensor], dweight: Optional[Tensor],
                        dbias: Optional[Tensor], hidden: Optional[Tensor], weight: Optional[Tensor],
                        target: Optional[Tensor], bias: Optional[Tensor], ignore_index: int, label_smoothing: float,
                        z_loss: float, softcap: float, reduction: str, need_dhidden: bool, need_dweight: bool,
                        need_dbias: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    like = next(t for t in (dhidden, dweight, dbias, hidden) if t is not None)
    mod = select(SPEC, like.device, like.dtype, backend)
    dh, dw, db = mod.backward(grad, dhidden, dweight, dbias, hidden, weight, target, bias, ignore_index,
                              label_smoothing, z_loss, softcap, reduction, need_dhidden, need_dweight, need_dbias)
    shape = (dhidden if dhidden is not None else hidden).shape if dh is not None else None
    return (like.new_empty(0) if dh is None else shaped(dh, shape), like.new_empty(0) if dw is None else dw,
            like.new_empty(0) if db is None else db)


_flce_backward = torch.library.custom_op(f"tessera::{OP}_backward", mutates_args=())(_flce_backward_impl)


@_flce_backward.register_fake
def _(grad, dhidden, dweight, dbias, hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
      reduction, need_dhidden, need_dweight, need_dbias, backend):
    like = next(t for t in (dhidden, dweight, dbias, hidden) if t is not None)

    def out(need, stored, inp):
        src = stored if stored is not None else inp
        return src.new_empty(src.shape) if need and src is not None else like.new_empty(0)
    return out(need_dhidden, dhidden, hidden), out(need_dweight, dweight, weight), out(need_dbias, dbias, bias)


def _setup(ctx, inputs, output):
    hidden, weight, target, bias = inputs[:4]
    ctx.opts = inputs[4:9]  # ignore_index, label_smoothing, z_loss, softcap, reduction
    ctx.need = inputs[9:12]
    ctx.backend = inputs[12]
    _, dh, dw, db = output
    ctx.mark_non_differentiable(dh, dw, db)
    ctx.set_materialize_grads(False)  # no zero "gradients" for the stored dh / dweight / dbias
    if ctx.opts[4] == "none":  # recomputed in backward from the inputs
        ctx.save_for_backward(hidden, weight, target, bias)
    else:                      # computed in the forward; the inputs are not kept alive
        ctx.save_for_backward(*(d if n else None for d, n in zip((dh, dw, db), ctx.need)))


def _backward(ctx, dloss, _ddh, _ddw, _ddb):
    saved = ctx.saved_tensors
    if dloss is None:  # the loss itself did not reach the output being differentiated
        return (None,) * 13
    if ctx.opts[4] == "none":
        grads = _flce_backward(dloss, None, None, None, *saved, *ctx.opts, *ctx.need, ctx.backend)
    elif upstream_is_one(_flce_backward, _flce_backward_impl, dloss, *saved):
        grads = saved
    else:
        grads = _flce_backward(dloss, *saved, None, None, None, None, *ctx.opts, *ctx.need, ctx.backend)
    dh, dw, db = (g if n else None for g, n in zip(grads, ctx.need))
    return (dh, dw, None, db) + (None,) * 9


_flce.register_autograd(_backward, setup_context=_setup)


def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None,
                               ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                               softcap: float = 0.0, reduction: str = "mean", *, backend: Optional[str] = None):
    """``tessera.cross_entropy(hidden @ weight.T + bias, target, ...)`` computed in chunks of tokens,
    never holding the full logits (see the module docstring)."""
    f = direct(_flce, _flce_impl, hidden, weight, target, bias)
    if f is _flce or weight is None or target is None:  # before the schema parser (the body checks too)
        _checks.python_types(OP, {"hidden": hidden, "weight": weight, "target": target, "bias": bias},
                             {"label_smoothing": label_smoothing, "z_loss": z_loss, "softcap": softcap})
        for name, t in (("weight", weight), ("target", target)):
            if not isinstance(t, Tensor):
                raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        loss_option_types(OP, ignore_index, reduction)
    # (the direct path runs only when nothing needs a gradient)
    grad = f is _flce and torch.is_grad_enabled()
    need = (grad and hidden.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad)
    loss, *_ = f(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction, *need,
                 _checks.backend_arg(OP, backend))
    return loss


SPEC = register_op(OpSpec(
    name=OP, fn=fused_linear_cross_entropy, ref=fused_linear_cross_entropy_ref, eager=fused_linear_cross_entropy_eager,
    kernels={"reference": "tessera.ops.fused_linear_cross_entropy.ref",
             "cpu": "tessera.ops.fused_linear_cross_entropy.cpu",
             "triton": "tessera.ops.fused_linear_cross_entropy.triton"},
    cases=_spec.cases(), grad_inputs=("hidden", "weight", "bias"),
    bytes_fwd=_spec.bytes_fwd, flops_fwd=_spec.flops_fwd, bound="compute", compute_dtype=_spec.compute_dtype,
    bench_cases=_spec.bench_cases(),
    fp32_grad_tol=_spec.FP32_GRAD_TOL,
    fuzz="test_fused_linear_cross_entropy.py",
))
