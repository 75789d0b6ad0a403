"""SwiGLU (``tessera.swiglu``):  out = silu(gate) * up.

gate and up have the same shape and dtype; they are usually the two halves of one
fused projection, ``gate, up = proj.chunk(2, -1)``, which the kernels read in place
(row stride 2n, no copy).  Backward is one fused kernel per backend producing both
gradients in one pass:

    dgate = dy * up * silu'(gate),   dup = dy * silu(gate)

Math is fp32 for every dtype; silu's limits at +-inf are exact.  Shared code:
``ops/_elementwise``.

Roofline: forward reads gate, up and writes out; backward reads dy, gate, up and
writes dgate, dup.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, shaped
from ..._registry import OpSpec, register_op, select
from .. import _elementwise as ew
from .ref import swiglu_eager, swiglu_ref

OP = "swiglu"


def _swiglu_impl(gate: Tensor, up: Tensor, backend: str) -> Tensor:
    ew.check_gated(OP, gate, up)
    mod = select(SPEC, gate.device, gate.dtype, backend)
    return shaped(mod.forward(ew.as_rows(gate), ew.as_rows(up)), gate.shape)


_swiglu = torch.library.custom_op("tessera::swiglu", mutates_args=())(_swiglu_impl)


@_swiglu.register_fake
def _(gate, up, backend):
    ew.check_gated(OP, gate, up)
    return gate.new_empty(gate.shape)


@torch.library.custom_op("tessera::swiglu_backward", mutates_args=())
def _swiglu_backward(dy: Tensor, gate: Tensor, up: Tensor, backend: str) -> tuple[Tensor, Tensor]:
    mod = select(SPEC, gate.device, gate.dtype, backend)
    dgate, dup = mod.backward(ew.as_rows(dy), ew.as_rows(gate), ew.as_rows(up))
    return shaped(dgate, gate.shape), shaped(dup, gate.shape)


@_swiglu_backward.register_fake
def _(dy, gate, up, backend):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _setup(ctx, inputs, output):
    gate, up, backend = inputs
    ctx.backend = backend
    ctx.save_for_backward(gate, up)


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = _swiglu_backward(dy, gate, up, ctx.backend)
    return dgate, dup, None


_swiglu.register_autograd(_backward, setup_context=_setup)


def swiglu(gate: Tensor, up: Tensor, *, backend: Optional[str] = None) -> Tensor:
    """SwiGLU: ``silu(gate) * up``, elementwise; gate/up may be ``chunk(2, -1)`` views."""
    f = direct(_swiglu, _swiglu_impl, gate, up)
    if f is _swiglu:  # before the schema parser, for clear TypeErrors (the bodies check for themselves)
        ew.check_gated(OP, gate, up)
    return f(gate, up, _checks.backend_arg(OP, backend))


_VARIANTS = [("", {})]

SPEC = register_op(OpSpec(
    name=OP, fn=swiglu, ref=swiglu_ref, eager=swiglu_eager,
    kernels={"reference": "tessera.ops.swiglu.ref", "cpu": "tessera.ops.swiglu.cpu",
             "triton": "tessera.ops.swiglu.triton",
             "opencl": "tessera.ops.swiglu.opencl",
             "cpu:aarch64": "tessera.ops.swiglu.cross", "cpu:riscv64": "tessera.ops.swiglu.cross"},
    cases=ew.gated_cases(_VARIANTS), grad_inputs=("gate", "up"),
    bytes_fwd=ew.gated_bytes_fwd, bytes_bwd=ew.gated_bytes_bwd,
    flops_fwd=lambda kw: 5 * kw["gate"].numel(),
    bench_cases=ew.gated_bench_cases(_VARIANTS),
))
