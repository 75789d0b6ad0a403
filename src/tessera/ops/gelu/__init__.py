"""GELU (``tessera.gelu``), exact (erf) or tanh-approximated, as ``F.gelu``.

    approximate="none":  y = x * Phi(x),     Phi(x) = (1 + erf(x / sqrt2)) / 2
    approximate="tanh":  y = 0.5 x (1 + tanh(u)) = x * sigmoid(2u),
                         u = sqrt(2/pi) (x + 0.044715 x^3)

Backward is one fused elementwise kernel per backend (dx = dy * gelu'(x), recomputed
from the saved x).  Math is fp32 for every dtype; limits at +-inf are exact
(gelu(+inf) = inf, gelu(-inf) = 0 where plain PyTorch gives NaN).  Shared code:
``ops/_elementwise``.

Roofline: forward reads x and writes y; backward reads dy, x and writes dx.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, shaped
from ..._registry import OpSpec, register_op, select
from .. import _elementwise as ew
from .ref import gelu_eager, gelu_ref

OP = "gelu"


def _check(x, approximate):
    ew.check_unary(OP, x)
    ew.check_approximate(OP, approximate)


def _gelu_impl(x: Tensor, approximate: str, backend: str) -> Tensor:
    _check(x, approximate)
    mod = select(SPEC, x.device, x.dtype, backend)
    return shaped(mod.forward(ew.as_rows(x), approximate), x.shape)


_gelu = torch.library.custom_op("tessera::gelu", mutates_args=())(_gelu_impl)


@_gelu.register_fake
def _(x, approximate, backend):
    _check(x, approximate)
    return x.new_empty(x.shape)


@torch.library.custom_op("tessera::gelu_backward", mutates_args=())
def _gelu_backward(dy: Tensor, x: Tensor, approximate: str, backend: str) -> Tensor:
    mod = select(SPEC, x.device, x.dtype, backend)
    return shaped(mod.backward(ew.as_rows(dy), ew.as_rows(x), approximate), x.shape)


@_gelu_backward.register_fake
def _(dy, x, approximate, backend):
    return x.new_empty(x.shape)


def _setup(ctx, inputs, output):
    x, approximate, backend = inputs
    ctx.approximate, ctx.backend = approximate, backend
    ctx.save_for_backward(x)


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return _gelu_backward(dy, x, ctx.approximate, ctx.backend), None, None


_gelu.register_autograd(_backward, setup_context=_setup)


def gelu(x: Tensor, approximate: str = "none", *, backend: Optional[str] = None) -> Tensor:
    """GELU, elementwise: ``approximate="none"`` (erf) or ``"tanh"``, as ``torch.nn.functional.gelu``."""
    f = direct(_gelu, _gelu_impl, x)
    if f is _gelu:  # before the schema parser, for clear TypeErrors (the bodies check for themselves)
        _check(x, approximate)
    return f(x, approximate, _checks.backend_arg(OP, backend))


_VARIANTS = [("none-", {"approximate": "none"}), ("tanh-", {"approximate": "tanh"})]

SPEC = register_op(OpSpec(
    name=OP, fn=gelu, ref=gelu_ref, eager=gelu_eager,
    kernels={"reference": "tessera.ops.gelu.ref", "cpu": "tessera.ops.gelu.cpu",
             "triton": "tessera.ops.gelu.triton",
             "opencl": "tessera.ops.gelu.opencl",
             "cpu:aarch64": "tessera.ops.gelu.cross", "cpu:riscv64": "tessera.ops.gelu.cross"},
    cases=ew.unary_cases(_VARIANTS), grad_inputs=("x",),
    bytes_fwd=ew.unary_bytes_fwd, bytes_bwd=ew.unary_bytes_bwd,
    flops_fwd=lambda kw: 8 * kw["x"].numel(),   # exp + a short polynomial / cubic per element
    bench_cases=ew.unary_bench_cases(_VARIANTS),
))
