"""LayerNorm, optionally fused with the residual add (``tessera.layer_norm``).

    h    = x + residual                       (when residual is given)
    y    = (h - mean(h)) * rsqrt(var(h) + eps) * weight + bias

Returns ``y``, or ``(y, h)`` with a residual (the pre-norm residual stream of a
transformer block).  ``var`` is the biased variance over the last dim, as in
``torch.nn.functional.layer_norm``.  Statistics (mean, rstd) are fp32 and saved
for backward; ``y`` and ``h`` have x's dtype; ``weight``/``bias`` may be any
float dtype (or None: no scale / no shift) and their gradients come back in it.

Backward is one fused kernel per backend: dx (= dresidual) for every row and
per-thread/per-program partial sums of dweight and dbias, reduced once.

Roofline (bytes that must cross DRAM): forward reads x (+ residual) and writes y
(+ h); backward reads dy, h (+ dh) and writes dx.  weight, bias, mean and rstd
are O(N)/O(M).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, rows, shaped
from ..._registry import Case, OpSpec, register_op, select
from ... import _cases as C
from ..rms_norm import norm_bytes_bwd, norm_bytes_fwd  # the same roofline: one pass over rows
from .ref import layer_norm_eager, layer_norm_ref

OP = "layer_norm"


def _check(x, weight, bias, residual, eps):
    _checks.tensor(OP, "x", x)
    if x.shape[-1] == 0:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must have a non-empty last dimension")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            _checks.tensor(OP, name, p)
            _checks.last_dim_vector(OP, name, p, "x", x)
    if residual is not None:
        _checks.tensor(OP, "residual", residual)
        _checks.same_shape(OP, "x", x, "residual", residual)
        _checks.same_dtype(OP, "x", x, "residual", residual)
    _checks.same_device(OP, "x", x, weight=weight, bias=bias, residual=residual)
    _checks.finite_float(OP, "eps", eps, min_value=0.0)


def _layer_norm_impl(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], residual: Optional[Tensor],
                eps: float, backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _check(x, weight, bias, residual, eps)
    mod = select(SPEC, x.device, x.dtype, backend)
    y, h, mean, rstd = mod.forward(rows(x), weight, bias, None if residual is None else rows(residual), eps)
    h = x.new_empty(0) if h is None else shaped(h, x.shape)
    return shaped(y, x.shape), h, shaped(mean, x.shape[:-1]), shaped(rstd, x.shape[:-1])


_layer_norm = torch.library.custom_op("tessera::layer_norm", mutates_args=())(_layer_norm_impl)


@_layer_norm.register_fake
def _(x, weight, bias, residual, eps, backend):
    _check(x, weight, bias, residual, eps)
    h = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    stat = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return x.new_empty(x.shape), h, stat, stat.new_empty(stat.shape)


@torch.library.custom_op("tessera::layer_norm_backward", mutates_args=())
def _layer_norm_backward(dy: Tensor, dh: Optional[Tensor], h: Tensor, weight: Optional[Tensor],
                         bias: Optional[Tensor], mean: Tensor, rstd: Tensor, eps: float,
                         backend: str) -> tuple[Tensor, Tensor, Tensor]:
    mod = select(SPEC, h.device, h.dtype, backend)
    dx, dw, db = mod.backward(rows(dy), None if dh is None else rows(dh), rows(h), weight, bias,
                              mean.reshape(-1).contiguous(), rstd.reshape(-1).contiguous(), eps)
    dw = h.new_empty(0) if dw is None else dw.to(weight.dtype)
    db = h.new_empty(0) if db is None else db.to(bias.dtype)
    return shaped(dx, h.shape), dw, db


@_layer_norm_backward.register_fake
def _(dy, dh, h, weight, bias, mean, rstd, eps, backend):
    dw = h.new_empty(0) if weight is None else weight.new_empty(weight.shape)
    db = h.new_empty(0) if bias is None else bias.new_empty(bias.shape)
    return h.new_empty(h.shape), dw, db


def _setup(ctx, inputs, output):
    x, weight, bias, residual, eps, backend = inputs
    _, h, mean, rstd = output
    ctx.has_residual = residual is not None
    ctx.eps, ctx.backend = eps, backend
    ctx.save_for_backward(h if ctx.has_residual else x, weight, bias, mean, rstd)


def _backward(ctx, dy, dh, _dmean, _drstd):
    h, weight, bias, mean, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(h)
    dx, dw, db = _layer_norm_backward(dy, dh if ctx.has_residual else None, h, weight, bias, mean, rstd,
                                      ctx.eps, ctx.backend)
    return (dx, dw if weight is not None else None, db if bias is not None else None,
            dx if ctx.has_residual else None, None, None)


_layer_norm.register_autograd(_backward, setup_context=_setup)


def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor] = None, eps: float = 1e-5,
               residual: Optional[Tensor] = None, *, backend: Optional[str] = None):
    """LayerNorm over the last dim; with ``residual``, returns ``(norm(x + residual), x + residual)``."""
    f = direct(_layer_norm, _layer_norm_impl, x, weight, bias, residual)
    if f is _layer_norm:  # before the schema parser, for clear TypeErrors (the bodies check for themselves)
        _checks.python_types(OP, {"x": x, "weight": weight, "bias": bias, "residual": residual}, {"eps": eps})
    y, h, _, _ = f(x, weight, bias, residual, eps, _checks.backend_arg(OP, backend))
    return (y, h) if residual is not None else y


# ---------------------------------------------------------------- spec: cases, roofline

def _build(name, shape, layout, tags, residual=False, eps=1e-5, weight=True, bias=True):
    def mk(dtype, device, gen):
        kw = {"x": C.make(shape, dtype, device, gen, layout), "eps": eps}
        kw["weight"] = C.make(shape[-1:], dtype, device, gen) if weight else None
        kw["bias"] = C.make(shape[-1:], dtype, device, gen) if bias else None
        if residual:
            kw["residual"] = C.make(shape, dtype, device, gen, "contig")
        return kw
    return Case(name + ("+res" if residual else ""), mk, frozenset(tags))


def _zero_rows(dtype, device, gen):
    # eps = 0 and a zero row: 0 * inf = NaN in every backend, as in the float64 reference
    x = C.make((4, 33), dtype, device, gen)
    x[1] = 0
    return {"x": x, "weight": C.make((33,), dtype, device, gen), "bias": C.make((33,), dtype, device, gen),
            "eps": 0.0}


def _constant_rows(dtype, device, gen):
    # variance exactly 0: y must be exactly bias (the shifted mean makes h - mean exactly 0)
    x = C.make((5, 65), dtype, device, gen)
    x[1] = x[1, 7]
    x[3] = x[3, 0]
    return {"x": x, "weight": C.make((65,), dtype, device, gen), "bias": C.make((65,), dtype, device, gen),
            "eps": 1e-5}


def _fp16_big(dtype, device, gen):
    # values near the fp16 maximum: (h - mean)^2 overflows fp16 but not the fp32 statistics
    return {"x": C.make((3, 77), dtype, device, gen, scale=2e4).clamp(-6e4, 6e4),
            "weight": C.make((77,), dtype, device, gen), "bias": C.make((77,), dtype, device, gen), "eps": 1e-5}


def _big_mean(dtype, device, gen):
    # |mean| >> std: E[h^2] - E[h]^2 would cancel catastrophically; two passes do not
    return {"x": C.make((4, 300), dtype, device, gen) + 500.0, "weight": C.make((300,), dtype, device, gen),
            "bias": C.make((300,), dtype, device, gen), "eps": 1e-5}


def _cases():
    out = C.standard_cases(lambda n, s, l, t: _build(n, s, l, t))
    out += [_build("res-" + n, s, "contig", t, residual=True) for n, s, t in C.row_shapes() if "large" not in t]
    out += [_build("res-rowslice", (5, 3, 123), "rowslice", {"layout"}, residual=True),
            _build("res-broadcast", (5, 3, 123), "broadcast", {"layout"}, residual=True),
            _build("noweight-7x123", (7, 123), "contig", set(), weight=False),
            _build("nobias-7x123", (7, 123), "contig", set(), bias=False),
            _build("noaffine-7x123", (7, 123), "contig", set(), weight=False, bias=False),
            _build("nobias-res-4x1025", (4, 1025), "contig", set(), residual=True, bias=False),
            _build("large-8192", (8, 8192), "contig", {"large"}, residual=True),
            Case("zero-rows-eps0", _zero_rows, frozenset({"extreme", "nograd"})),
            Case("constant-rows", _constant_rows, frozenset({"extreme"})),
            Case("near-fp16-max", _fp16_big, frozenset({"extreme"})),
            Case("big-mean", _big_mean, frozenset({"extreme"}))]
    return out


def _bench_cases():
    return [_build("8192x4096", (8192, 4096), "contig", set()),
            _build("8192x4096", (8192, 4096), "contig", set(), residual=True)]


SPEC = register_op(OpSpec(
    name=OP, fn=layer_norm, ref=layer_norm_ref, eager=layer_norm_eager,
    kernels={"reference": "tessera.ops.layer_norm.ref", "cpu": "tessera.ops.layer_norm.cpu",
             "triton": "tessera.ops.layer_norm.triton", "opencl": "tessera.ops.layer_norm.opencl",
             "cpu:aarch64": "tessera.ops.layer_norm.cross", "cpu:riscv64": "tessera.ops.layer_norm.cross"},
    cases=_cases(), grad_inputs=("x", "weight", "bias", "residual"),
    bytes_fwd=norm_bytes_fwd, bytes_bwd=norm_bytes_bwd,
    flops_fwd=lambda kw: 6 * kw["x"].numel(),
    bench_cases=_bench_cases(),
    # dweight/dbias sum over all rows: fp32 error grows ~sqrt(rows); give it room proportional to that.
    fp32_grad_tol={"weight": (1e-5, 1e-4), "bias": (1e-5, 1e-4)},
))
