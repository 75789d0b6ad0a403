"""Numerically safe softmax along any dim (``tessera.softmax``).

    y = exp(x - max(x)) / sum(exp(x - max(x)))        along ``dim``

fp32 math inside for fp32/fp16/bf16 storage; ``y`` has x's dtype and is
always contiguous in x's shape.  Special rows (see ref.py, the contract):
fully ``-inf`` (masked) rows give zeros with zero gradient, never NaN; a row
holding ``+inf`` or NaN is NaN everywhere (as ``torch.softmax``).

``dim`` may be negative.  Kernels work on rows of the last dim; any other dim
is moved last first (a copy when the layout needs it) and the result is
copied back into a contiguous tensor of x's shape, which the fake kernel
reproduces exactly.

Backward is one fused kernel per backend from the saved output:
dx = y * (dy - sum(dy * y)).

Roofline (bytes that must cross DRAM): forward reads x and writes y; backward
reads dy and y and writes dx.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import new_output, rows, direct
from ..._registry import Case, OpSpec, register_op, select
from ... import _cases as C
from .ref import softmax_eager, softmax_ref

OP = "softmax"


def _check_dim(x: Tensor, dim) -> None:
    # torch.compile(dynamic=True) passes Python ints as SymInt; a bool is not a dim
    if isinstance(dim, bool) or not isinstance(dim, (int, torch.SymInt)):
        raise TypeError(f"tessera.{OP}: argument 'dim' must be an int, got {type(dim).__name__}")
    n = x.dim()
    if not -n <= dim < n:
        raise ValueError(f"tessera.{OP}: argument 'dim'={dim} is out of range for 'x' "
                         f"({_checks.describe(x)}); expected {-n} <= dim <= {n - 1}")


def _check(x, dim) -> None:
    _checks.tensor(OP, "x", x)
    _check_dim(x, dim)


def _rows_along(t: Tensor, dim: int):
    """(row view with ``dim`` last, the moved shape) -- a view unless the layout forbids it."""
    if dim % t.dim() != t.dim() - 1:
        t = t.movedim(dim, -1)
    return rows(t), t.shape


def _restore(out: Tensor, moved_shape, dim: int, ndim: int) -> Tensor:
    """Rows back to a contiguous tensor of the original shape (default strides, like the fake kernel)."""
    out = out.view(moved_shape)
    if dim % ndim != ndim - 1:
        out = out.movedim(-1, dim).clone(memory_format=torch.contiguous_format)
    return out


def _softmax_impl(x: Tensor, dim: int, backend: str) -> Tensor:
    _check(x, dim)
    mod = select(SPEC, x.device, x.dtype, backend)
    if x.numel() == 0:
        return new_output(x.shape, x.dtype, x.device)
    xr, moved = _rows_along(x, dim)
    return _restore(mod.forward(xr), moved, dim, x.dim())


_softmax = torch.library.custom_op("tessera::softmax", mutates_args=())(_softmax_impl)


@_softmax.register_fake
def _(x, dim, backend):
    _check(x, dim)
    return x.new_empty(x.shape)


def _check_backward(dy, y, dim) -> None:
    _checks.tensor(OP, "y", y)
    _checks.tensor(OP, "dy", dy)
    _checks.same_shape(OP, "y", y, "dy", dy)
    _checks.same_dtype(OP, "y", y, "dy", dy)
    _checks.same_device(OP, "y", y, dy=dy)
    _check_dim(y, dim)


@torch.library.custom_op("tessera::softmax_backward", mutates_args=())
def _softmax_backward(dy: Tensor, y: Tensor, dim: int, backend: str) -> Tensor:
    _check_backward(dy, y, dim)
    mod = select(SPEC, y.device, y.dtype, backend)
    if y.numel() == 0:
        return new_output(y.shape, y.dtype, y.device)
    dyr, moved = _rows_along(dy, dim)
    yr, _ = _rows_along(y, dim)
    return _restore(mod.backward(dyr, yr), moved, dim, y.dim())


@_softmax_backward.register_fake
def _(dy, y, dim, backend):
    _check_backward(dy, y, dim)
    return y.new_empty(y.shape)


def _setup(ctx, inputs, output):
    _, dim, backend = inputs
    ctx.dim, ctx.backend = dim, backend
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_backward(dy, y, ctx.dim, ctx.backend), None, None


_softmax.register_autograd(_backward, setup_context=_setup)


def softmax(x: Tensor, dim: int = -1, *, backend: Optional[str] = None) -> Tensor:
    """Softmax along ``dim``; fully ``-inf`` rows give zeros, rows with ``+inf``/NaN give NaN."""
    f = direct(_softmax, _softmax_impl, x)
    if f is _softmax or type(dim) is not int:  # before the schema parser / int(), for clear messages
        _check(x, dim)
    # a symbolic dim is specialised: it picks the kernel's layout, it is not a size
    return f(x, int(dim), _checks.backend_arg(OP, backend))


# ---------------------------------------------------------------- spec: cases, roofline

def _build(name, shape, layout, tags, dim=-1, scale=1.0):
    def mk(dtype, device, gen):
        return {"x": C.make(shape, dtype, device, gen, layout, scale), "dim": dim}
    return Case(name, mk, frozenset(tags))


def _masked(name, M, N, tags, first_masked=0):
    """Row 0: the first `first_masked` (else a causal-like prefix) entries kept, the rest -inf;
    row 1: fully masked (must give zeros and zero gradient); row 2: one -inf; others plain."""
    def mk(dtype, device, gen):
        x = C.make((M, N), dtype, device, gen)
        if first_masked:
            x[0, :first_masked] = float("-inf")  # a whole leading chunk masked: the max starts at -inf
        else:
            x[0, N // 3:] = float("-inf")
        x[1] = float("-inf")
        x[2, N // 2] = float("-inf")
        return {"x": x, "dim": -1}
    return Case(name, mk, frozenset(tags) | {"extreme"})


def _posinf(dtype, device, gen):
    # documented choice: a row holding +inf is NaN everywhere (forward and gradient), like torch
    x = C.make((4, 33), dtype, device, gen)
    x[1, 5] = float("inf")
    return {"x": x, "dim": -1}


def _near_fp16_max(dtype, device, gen):
    # exp(x) overflows for every x > 88.7: only the max shift keeps these rows finite
    x = C.make((5, 77), dtype, device, gen, scale=2e4).clamp(-6e4, 6e4)
    x[0, 3] = 65504.0
    x[1] = -65504.0
    x[1, 7] = 65504.0
    x[2, :40] = 65504.0  # many tied maxima
    return {"x": x, "dim": -1}


def _cases():
    out = C.standard_cases(lambda n, s, l, t: _build(n, s, l, t))
    out += [
        _build("dim0-5x7x33", (5, 7, 33), "contig", set(), dim=0),
        _build("dim1-5x7x33", (5, 7, 33), "contig", set(), dim=1),
        _build("dim-2-transposed-4x6x9", (4, 6, 9), "transposed", {"layout"}, dim=-2),
        _build("dim0-rowslice-6x40", (6, 40), "rowslice", {"layout"}, dim=0),
        _build("1d-123", (123,), "contig", set(), dim=0),
        _build("empty-4x0", (4, 0), "contig", {"empty"}),
        _build("empty-dim1-3x0x5", (3, 0, 5), "contig", {"empty"}, dim=1),
        _build("2x8200", (2, 8200), "contig", set()),  # > one Triton block: the online path
        _build("long-2x70001", (2, 70001), "contig", {"large"}),  # > the C scratch: chunked path
        _build("logits-1e4-6x257", (6, 257), "contig", {"extreme"}, scale=1e4),
        Case("near-fp16-max-5x77", _near_fp16_max, frozenset({"extreme"})),
        Case("posinf-4x33", _posinf, frozenset({"extreme"})),
        _masked("mask-5x77", 5, 77, set()),
        _masked("mask-3x8200", 3, 8200, set(), first_masked=8192),
        _masked("mask-3x70001", 3, 70001, {"large"}, first_masked=65536),
    ]
    return out


def _nbytes(kw, arrays):
    x = kw["x"]
    return arrays * x.numel() * x.element_size()


def _bench_cases():
    return [_build("8192x4096", (8192, 4096), "contig", set()),
            _build("1024x32000", (1024, 32000), "contig", {"large"})]


SPEC = register_op(OpSpec(
    name=OP, fn=softmax, ref=softmax_ref, eager=softmax_eager,
    kernels={"reference": "tessera.ops.softmax.ref", "cpu": "tessera.ops.softmax.cpu",
             "triton": "tessera.ops.softmax.triton", "opencl": "tessera.ops.softmax.opencl",
             "cpu:aarch64": "tessera.ops.softmax.cross", "cpu:riscv64": "tessera.ops.softmax.cross"},
    cases=_cases(), grad_inputs=("x",),
    bytes_fwd=lambda kw: _nbytes(kw, 2),   # read x, write y
    bytes_bwd=lambda kw: _nbytes(kw, 3),   # read dy, y, write dx
    flops_fwd=lambda kw: 5 * kw["x"].numel(),  # max, subtract, exp, sum, scale
    bench_cases=_bench_cases(),
))
