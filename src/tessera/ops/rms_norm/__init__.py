"""RMSNorm, optionally fused with the residual add (``tessera.rms_norm``).

    h    = x + residual                       (when residual is given)
    y    = h * rsqrt(mean(h^2, -1) + eps) * weight

Returns ``y``, or ``(y, h)`` with a residual (the pre-norm residual stream of a
transformer block, as in vLLM's ``fused_add_rms_norm`` and Liger's RMSNorm).
Statistics are fp32; ``y`` and ``h`` have x's dtype; ``weight`` may be any float
dtype and its gradient comes back in that dtype.

Backward is one fused kernel per backend: dx (= dresidual) for every row and
per-thread/per-program partial sums of dweight, reduced once.

Roofline (bytes that must cross DRAM): forward reads x (+ residual) and writes y
(+ h); backward reads dy, h (+ dh) and writes dx.  weight and rstd are O(N)/O(M).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, rows, shaped
from ..._registry import Case, OpSpec, register_op, select
from ... import _cases as C
from .ref import rms_norm_eager, rms_norm_ref

OP = "rms_norm"


def _check(x, weight, residual, eps):
    _checks.tensor(OP, "x", x)
    if x.shape[-1] == 0:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must have a non-empty last dimension")
    if weight is not None:
        _checks.tensor(OP, "weight", weight)
        _checks.last_dim_vector(OP, "weight", weight, "x", x)
    if residual is not None:
        _checks.tensor(OP, "residual", residual)
        _checks.same_shape(OP, "x", x, "residual", residual)
        _checks.same_dtype(OP, "x", x, "residual", residual)
    _checks.same_device(OP, "x", x, weight=weight, residual=residual)
    _checks.finite_float(OP, "eps", eps, min_value=0.0)


def _rms_norm_impl(x: Tensor, weight: Optional[Tensor], residual: Optional[Tensor], eps: float,
              backend: str) -> tuple[Tensor, Tensor, Tensor]:
    _check(x, weight, residual, eps)
    mod = select(SPEC, x.device, x.dtype, backend)
    y, h, rstd = mod.forward(rows(x), weight, None if residual is None else rows(residual), eps)
    h = x.new_empty(0) if h is None else shaped(h, x.shape)
    return shaped(y, x.shape), h, shaped(rstd, x.shape[:-1])


_rms_norm = torch.library.custom_op("tessera::rms_norm", mutates_args=())(_rms_norm_impl)


@_rms_norm.register_fake
def _(x, weight, residual, eps, backend):
    _check(x, weight, residual, eps)
    h = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    return x.new_empty(x.shape), h, x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("tessera::rms_norm_backward", mutates_args=())
def _rms_norm_backward(dy: Tensor, dh: Optional[Tensor], h: Tensor, weight: Optional[Tensor], rstd: Tensor,
                       eps: float, backend: str) -> tuple[Tensor, Tensor]:
    mod = select(SPEC, h.device, h.dtype, backend)
    dx, dw = mod.backward(rows(dy), None if dh is None else rows(dh), rows(h), weight,
                         rstd.reshape(-1).contiguous(), eps)
    dw = h.new_empty(0) if dw is None else dw.to(weight.dtype)
    return shaped(dx, h.shape), dw


@_rms_norm_backward.register_fake
def _(dy, dh, h, weight, rstd, eps, backend):
    dw = h.new_empty(0) if weight is None else weight.new_empty(weight.shape)
    return h.new_empty(h.shape), dw


def _setup(ctx, inputs, output):
    x, weight, residual, eps, backend = inputs
    _, h, rstd = output
    ctx.has_residual = residual is not None
    ctx.eps, ctx.backend = eps, backend
    ctx.save_for_backward(h if ctx.has_residual else x, weight, rstd)


def _backward(ctx, dy, dh, _drstd):
    h, weight, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(h)
    dx, dw = _rms_norm_backward(dy, dh if ctx.has_residual else None, h, weight, rstd, ctx.eps, ctx.backend)
    return dx, (dw if weight is not None else None), (dx if ctx.has_residual else None), None, None


_rms_norm.register_autograd(_backward, setup_context=_setup)


def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6, residual: Optional[Tensor] = None,
             *, backend: Optional[str] = None):
    """RMSNorm over the last dim; with ``residual``, returns ``(norm(x + residual), x + residual)``."""
    f = direct(_rms_norm, _rms_norm_impl, x, weight, residual)
    if f is _rms_norm:  # before the schema parser, for clear TypeErrors (the bodies check for themselves)
        _checks.python_types(OP, {"x": x, "weight": weight, "residual": residual}, {"eps": eps})
    y, h, _ = f(x, weight, residual, eps, _checks.backend_arg(OP, backend))
    return (y, h) if residual is not None else y


# ---------------------------------------------------------------- spec: cases, roofline

def _build(name, shape, layout, tags, residual=False, eps=1e-6, scale=1.0, with_weight=True):
    def mk(dtype, device, gen):
        kw = {"x": C.make(shape, dtype, device, gen, layout, scale), "eps": eps}
        kw["weight"] = C.make(shape[-1:], dtype, device, gen) if with_weight else None
        if residual:
            kw["residual"] = C.make(shape, dtype, device, gen, "contig", scale)
        return kw
    return Case(name + ("+res" if residual else ""), mk, frozenset(tags))


def _zero_rows(dtype, device, gen):
    x = C.make((4, 33), dtype, device, gen)
    x[1] = 0
    return {"x": x, "weight": C.make((33,), dtype, device, gen), "eps": 0.0}


def _fp16_big(dtype, device, gen):
    # values near the fp16 maximum: mean(h^2) overflows fp16 but not the fp32 statistics
    return {"x": C.make((3, 77), dtype, device, gen, scale=2e4).clamp(-6e4, 6e4),
            "weight": C.make((77,), dtype, device, gen), "eps": 1e-6}


def _cases():
    out = C.standard_cases(lambda n, s, l, t: _build(n, s, l, t))
    out += [_build("res-" + n, s, "contig", t, residual=True) for n, s, t in C.row_shapes() if "large" not in t]
    out += [_build("res-rowslice", (5, 3, 123), "rowslice", {"layout"}, residual=True),
            _build("noweight-7x123", (7, 123), "contig", set(), with_weight=False),
            _build("large-8192", (8, 8192), "contig", {"large"}, residual=True),
            Case("zero-rows-eps0", _zero_rows, frozenset({"extreme", "nograd"})),
            Case("near-fp16-max", _fp16_big, frozenset({"extreme"}))]
    return out


def norm_bytes_fwd(kw):
    """Roofline of a row norm (rms_norm, layer_norm) forward: per-feature parameters and
    per-row statistics are O(N) / O(M) and not counted."""
    x = kw["x"]
    n = 2 + (2 if kw.get("residual") is not None else 0)  # read x (+res), write y (+h)
    return n * x.numel() * x.element_size()


def norm_bytes_bwd(kw):
    x = kw["x"]
    n = 3 + (1 if kw.get("residual") is not None else 0)  # read dy, h (+dh), write dx
    return n * x.numel() * x.element_size()


def _bench_cases():
    return [_build("8192x4096", (8192, 4096), "contig", set()),
            _build("8192x4096", (8192, 4096), "contig", set(), residual=True)]


SPEC = register_op(OpSpec(
    name=OP, fn=rms_norm, ref=rms_norm_ref, eager=rms_norm_eager,
    kernels={"reference": "tessera.ops.rms_norm.ref", "cpu": "tessera.ops.rms_norm.cpu",
             "triton": "tessera.ops.rms_norm.triton", "opencl": "tessera.ops.rms_norm.opencl",
             "cpu:aarch64": "tessera.ops.rms_norm.cross", "cpu:riscv64": "tessera.ops.rms_norm.cross"},
    cases=_cases(), grad_inputs=("x", "weight", "residual"),
    bytes_fwd=norm_bytes_fwd, bytes_bwd=norm_bytes_bwd,
    flops_fwd=lambda kw: 4 * kw["x"].numel(),
    bench_cases=_bench_cases(),
    # dweight sums over all rows: fp32 error grows ~sqrt(rows); give it room proportional to that.
    fp32_grad_tol={"weight": (1e-5, 1e-4)},
))
