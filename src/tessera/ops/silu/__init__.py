"""SiLU / swish (``tessera.silu``):  y = x * sigmoid(x).

Backward is one fused elementwise kernel per backend: dx = dy * s * (1 + x (1 - s)),
s = sigmoid(x), recomputed from the saved x (nothing else is stored).  Math is fp32
for every dtype; the limits at +-inf are exact (silu(-inf) = 0 where plain PyTorch
gives NaN).  Shared code: ``ops/_elementwise``.

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
from .ref import silu_eager, silu_ref

OP = "silu"


def _silu_impl(x: Tensor, backend: str) -> Tensor:
    ew.check_unary(OP, x)
    mod = select(SPEC, x.device, x.dtype, backend)
    return shaped(mod.forward(ew.as_rows(x)), x.shape)


_silu = torch.library.custom_op("tessera::silu", mutates_args=())(_silu_impl)


@_silu.register_fake
def _(x, backend):
    ew.check_unary(OP, x)
    return x.new_empty(x.shape)


@torch.library.custom_op("tessera::silu_backward", mutates_args=())
def _silu_backward(dy: Tensor, x: Tensor, backend: str) -> Tensor:
    mod = select(SPEC, x.device, x.dtype, backend)
    return shaped(mod.backward(ew.as_rows(dy), ew.as_rows(x)), x.shape)


@_silu_backward.register_fake
def _(dy, x, backend):
    return x.new_empty(x.shape)


def _setup(ctx, inputs, output):
    x, backend = inputs
    ctx.backend = backend
    ctx.save_for_backward(x)


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return _silu_backward(dy, x, ctx.backend), None


_silu.register_autograd(_backward, setup_context=_setup)


def silu(x: Tensor, *, backend: Optional[str] = None) -> Tensor:
    """SiLU (swish): ``x * sigmoid(x)``, elementwise, fp32 math for fp32/fp16/bf16."""
    f = direct(_silu, _silu_impl, x)
    if f is _silu:  # before the schema parser, for clear TypeErrors (the bodies check for themselves)
        ew.check_unary(OP, x)
    return f(x, _checks.backend_arg(OP, backend))


_VARIANTS = [("", {})]

SPEC = register_op(OpSpec(
    name=OP, fn=silu, ref=silu_ref, eager=silu_eager,
    kernels={"reference": "tessera.ops.silu.ref", "cpu": "tessera.ops.silu.cpu",
             "triton": "tessera.ops.silu.triton",
             "opencl": "tessera.ops.silu.opencl",
             "cpu:aarch64": "tessera.ops.silu.cross", "cpu:riscv64": "tessera.ops.silu.cross"},
    cases=ew.unary_cases(_VARIANTS), grad_inputs=("x",),
    bytes_fwd=ew.unary_bytes_fwd, bytes_bwd=ew.unary_bytes_bwd,
    flops_fwd=lambda kw: 4 * kw["x"].numel(),   # exp, add, divide, multiply
    bench_cases=ew.unary_bench_cases(_VARIANTS),
))
