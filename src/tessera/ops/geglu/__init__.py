"""GeGLU (``tessera.geglu``):  out = gelu(gate, approximate) * up.

``approximate`` is ``"none"`` (erf GELU) or ``"tanh"``, as ``F.gelu``.  gate and up
have the same shape and dtype; they are usually ``proj.chunk(2, -1)`` views, read in
place (row stride 2n, no copy).  Backward is one fused kernel per backend producing
both gradients in one pass:

    dgate = dy * up * gelu'(gate),   dup = dy * gelu(gate)

Math is fp32 for every dtype; gelu's limits at +-inf are exact.  Shared code:
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
from .ref import geglu_eager, geglu_ref

OP = "geglu"


def _check(gate, up, approximate):
    ew.check_gated(OP, gate, up)
    ew.check_approximate(OP, approximate)


def _geglu_impl(gate: Tensor, up: Tensor, approximate: str, backend: str) -> Tensor:
    _check(gate, up, approximate)
    mod = select(SPEC, gate.device, gate.dtype, backend)
    return shaped(mod.forward(ew.as_rows(gate), ew.as_rows(up), approximate), gate.shape)


_geglu = torch.library.custom_op("tessera::geglu", mutates_args=())(_geglu_impl)


@_geglu.register_fake
def _(gate, up, approximate, backend):
    _check(gate, up, approximate)
    return gate.new_empty(gate.shape)


@torch.library.custom_op("tessera::geglu_backward", mutates_args=())
def _geglu_backward(dy: Tensor, gate: Tensor, up: Tensor, approximate: str,
                    backend: str) -> tuple[Tensor, Tensor]:
    mod = select(SPEC, gate.device, gate.dtype, backend)
    dgate, dup = mod.backward(ew.as_rows(dy), ew.as_rows(gate), ew.as_rows(up), approximate)
    return shaped(dgate, gate.shape), shaped(dup, gate.shape)


@_geglu_backward.register_fake
def _(dy, gate, up, approximate, backend):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _setup(ctx, inputs, output):
    gate, up, approximate, backend = inputs
    ctx.approximate, ctx.backend = approximate, backend
    ctx.save_for_backward(gate, up)


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = _geglu_backward(dy, gate, up, ctx.approximate, ctx.backend)
    return dgate, dup, None, None


_geglu.register_autograd(_backward, setup_context=_setup)


def geglu(gate: Tensor, up: Tensor, approximate: str = "none", *, backend: Optional[str] = None) -> Tensor:
    """GeGLU: ``gelu(gate, approximate) * up``, elementwise; gate/up may be ``chunk(2, -1)`` views."""
    f = direct(_geglu, _geglu_impl, gate, up)
    if f is _geglu:  # before the schema parser, for clear TypeErrors (the bodies check for themselves)
        _check(gate, up, approximate)
    return f(gate, up, approximate, _checks.backend_arg(OP, backend))


_VARIANTS = [("none-", {"approximate": "none"}), ("tanh-", {"approximate": "tanh"})]

SPEC = register_op(OpSpec(
    name=OP, fn=geglu, ref=geglu_ref, eager=geglu_eager,
    kernels={"reference": "tessera.ops.geglu.ref", "cpu": "tessera.ops.geglu.cpu",
             "triton": "tessera.ops.geglu.triton",
             "opencl": "tessera.ops.geglu.opencl",
             "cpu:aarch64": "tessera.ops.geglu.cross", "cpu:riscv64": "tessera.ops.geglu.cross"},
    cases=ew.gated_cases(_VARIANTS), grad_inputs=("gate", "up"),
    bytes_fwd=ew.gated_bytes_fwd, bytes_bwd=ew.gated_bytes_bwd,
    flops_fwd=lambda kw: 9 * kw["gate"].numel(),
    bench_cases=ew.gated_bench_cases(_VARIANTS),
))
