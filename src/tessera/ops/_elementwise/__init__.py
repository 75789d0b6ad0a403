"""Shared glue of the activation family: ``gelu``, ``silu``, ``swiglu``, ``geglu``.

The four ops are one computation with two shapes:

    unary:  y   = act(x)                dx    = dy * act'(x)
    gated:  out = act(gate) * up        dgate = dy * up * act'(gate),  dup = dy * act(gate)

with ``act`` one of three *kinds*: ``silu`` (x * sigmoid(x)), ``gelu`` (x * Phi(x),
Phi the normal CDF) and ``gelu_tanh`` (the tanh approximation).  Each op folder
(``ops/<op>/``) keeps its own custom ops, public function and spec; what is
common lives here:

* ``_elementwise/ref.py``       float64 math with exact +-inf limits, reference-backend kernels;
* ``_elementwise/cpu.py``       ctypes launchers of ``activations.c`` (all kinds, fwd + bwd);
* ``_elementwise/triton.py``    one Triton kernel specialised per (unary/gated, fwd/bwd, kind);
* ``_elementwise/opencl.py``    launchers of ``activations.cl`` (OpenCL C, all kinds, fwd + bwd);
* this module                   input checks, row views, test/bench cases and byte models.

Kernel modules see row views (2-D, unit inner stride, any row stride including 0)
and parallelise over elements, so ``gate, up = proj.chunk(2, -1)`` (row stride
2n) and broadcast inputs run without a copy.

Roofline (bytes that must cross DRAM): unary forward reads x and writes y, backward
reads dy, x and writes dx; gated forward reads gate, up and writes out, backward
reads dy, gate, up and writes dgate, dup.
"""
from __future__ import annotations

import torch

from ... import _checks
from ..._library import rows
from ..._registry import Case
from ... import _cases as C

# activation kinds, shared with activations.c and the Triton kernel
SILU, GELU, GELU_TANH = 0, 1, 2
APPROXIMATE = ("none", "tanh")


def gelu_kind(approximate: str) -> int:
    return GELU_TANH if approximate == "tanh" else GELU


# ---------------------------------------------------------------- checks and row views

def check_unary(op: str, x) -> None:
    _checks.tensor(op, "x", x, min_dim=0)


def check_gated(op: str, gate, up) -> None:
    _checks.tensor(op, "gate", gate, min_dim=0)
    _checks.tensor(op, "up", up, min_dim=0)
    _checks.same_device(op, "gate", gate, up=up)
    _checks.same_dtype(op, "gate", gate, "up", up)
    _checks.same_shape(op, "gate", gate, "up", up)


def check_approximate(op: str, approximate) -> None:
    _checks.choice(op, "approximate", approximate, APPROXIMATE)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """Row view for an elementwise kernel.  An empty tensor (possibly with a zero last
    dim, which ``rows`` cannot view) becomes a (0, n) view: kernels launch nothing."""
    if t.numel() == 0:
        return t.reshape(0, max(t.shape[-1], 1) if t.dim() else 1)
    return rows(t)


# ---------------------------------------------------------------- cases

# variants: list of (name prefix, extra kwargs), e.g. [("tanh-", {"approximate": "tanh"})]

def _make(shape, dtype, device, gen, layout):
    if len(shape) == 0:  # a 0-d tensor (testing.cases.make needs at least one dim)
        return C.make((1,), dtype, device, gen).view(())
    return C.make(shape, dtype, device, gen, layout)


def _unary_case(prefix, extra, name, shape, layout, tags):
    def mk(dtype, device, gen):
        return {"x": _make(shape, dtype, device, gen, layout), **extra}
    return Case(prefix + name, mk, frozenset(tags))


def _gated_case(prefix, extra, name, shape, layout, tags, up_layout=None):
    def mk(dtype, device, gen):
        return {"gate": _make(shape, dtype, device, gen, layout),
                "up": _make(shape, dtype, device, gen, up_layout or layout), **extra}
    return Case(prefix + name, mk, frozenset(tags))


def _chunk_case(prefix, extra, name, shape, tags):
    """gate, up = proj.chunk(2, -1): both views of one buffer with row stride 2n."""
    def mk(dtype, device, gen):
        proj = C.make((*shape[:-1], 2 * shape[-1]), dtype, device, gen)
        gate, up = proj.chunk(2, -1)
        return {"gate": gate, "up": up, **extra}
    return Case(prefix + name, mk, frozenset(tags))


# Values where the activations saturate, overflow fp16, or are exactly at the limits.
_HUGE = [0.0, 1e-3, 0.5, 1.0, 1e4, 3e4, 6e4, 65504.0, float("inf")]
_NAN = [float("nan"), 0.0, 1.0, -1.0, float("inf"), float("-inf")]


def _values(vals, dtype, device, gen, shape, scale=3.0):
    """The listed values (and their negatives) first, random normal * scale after."""
    v = torch.tensor(vals, dtype=torch.float64)
    v = torch.cat([v, -v])
    numel = 1
    for s in shape:
        numel *= s
    fill = torch.randn(numel, generator=gen, dtype=torch.float64) * scale
    fill[: v.numel()] = v
    return fill.view(shape).to(dtype).to(device)


def _tails(dtype, device, gen, shape):
    """A dense sweep over [-40, 40]: saturation of exp/erfc, the silu' zero near -1.28."""
    numel = shape[0] * shape[1]
    return torch.linspace(-40, 40, numel, dtype=torch.float64).view(shape).to(dtype).to(device)


def _special_unary(prefix, extra):
    def huge(dtype, device, gen):
        return {"x": _values(_HUGE, dtype, device, gen, (3, 41)), **extra}

    def nan(dtype, device, gen):
        return {"x": _values(_NAN, dtype, device, gen, (2, 9)), **extra}

    def tails(dtype, device, gen):
        return {"x": _tails(dtype, device, gen, (7, 143)), **extra}
    return [Case(prefix + "huge-inf", huge, frozenset({"extreme"})),
            Case(prefix + "nan", nan, frozenset({"extreme", "nograd"})),
            Case(prefix + "tails", tails, frozenset({"extreme"}))]


def _special_gated(prefix, extra):
    def huge(dtype, device, gen):
        # gate at the limits; up finite and nonzero (inf * 0 would be NaN in any backend),
        # large enough that out and dup overflow fp16 near its maximum
        up = _values([2.0, -3.0, 100.0], dtype, device, gen, (3, 41), scale=2.0)
        return {"gate": _values(_HUGE, dtype, device, gen, (3, 41)), "up": up, **extra}

    def nan(dtype, device, gen):
        return {"gate": _values(_NAN, dtype, device, gen, (2, 9)),
                "up": _values([1.0, float("nan")], dtype, device, gen, (2, 9)), **extra}

    def tails(dtype, device, gen):
        return {"gate": _tails(dtype, device, gen, (7, 143)),
                "up": C.make((7, 143), dtype, device, gen), **extra}
    return [Case(prefix + "huge-inf", huge, frozenset({"extreme"})),
            Case(prefix + "nan", nan, frozenset({"extreme", "nograd"})),
            Case(prefix + "tails", tails, frozenset({"extreme"}))]


# Sizes big enough for the multi-threaded cpu path (> cpu.PARALLEL_MIN_ELEMENTS): one
# long row split across threads, and a strided view whose thread ranges cut rows.
_THREADED = [("longrow-1x200003", (1, 200003), "contig", {"large"}),
             ("rowslice-97x1031", (97, 1031), "rowslice", {"large", "layout"}),
             ("broadcast-64x1031", (64, 1031), "broadcast", {"large", "layout"})]


def unary_cases(variants) -> list[Case]:
    out = []
    for prefix, extra in variants:
        out += C.standard_cases(lambda n, s, l, t: _unary_case(prefix, extra, n, s, l, t))
        out += [_unary_case(prefix, extra, n, s, l, t) for n, s, l, t in _THREADED]
        out += [_unary_case(prefix, extra, "scalar", (), "contig", set()),
                _unary_case(prefix, extra, "empty3x0", (3, 0), "contig", {"empty"})]
        out += _special_unary(prefix, extra)
    return out


def gated_cases(variants) -> list[Case]:
    out = []
    for prefix, extra in variants:
        out += C.standard_cases(lambda n, s, l, t: _gated_case(prefix, extra, n, s, l, t))
        out += [_gated_case(prefix, extra, n, s, l, t) for n, s, l, t in _THREADED]
        out += [_chunk_case(prefix, extra, "chunk-5x3x123", (5, 3, 123), {"layout"}),
                _chunk_case(prefix, extra, "chunk-33x1031", (33, 1031), {"layout", "large"}),
                _gated_case(prefix, extra, "mixed-rowslice-broadcast", (5, 3, 123), "rowslice", {"layout"},
                            up_layout="broadcast"),
                _gated_case(prefix, extra, "scalar", (), "contig", set()),
                _gated_case(prefix, extra, "empty3x0", (3, 0), "contig", {"empty"})]
        out += _special_gated(prefix, extra)
    return out


def unary_bench_cases(variants) -> list[Case]:
    return [_unary_case(p, e, "8192x4096", (8192, 4096), "contig", set()) for p, e in variants]


def gated_bench_cases(variants) -> list[Case]:
    return [_gated_case(p, e, "8192x4096", (8192, 4096), "contig", set()) for p, e in variants]


# ---------------------------------------------------------------- roofline

def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def unary_bytes_fwd(kw) -> int:
    return 2 * _nbytes(kw["x"])          # read x, write y


def unary_bytes_bwd(kw) -> int:
    return 3 * _nbytes(kw["x"])          # read dy, x; write dx


def gated_bytes_fwd(kw) -> int:
    return 3 * _nbytes(kw["gate"])       # read gate, up; write out


def gated_bytes_bwd(kw) -> int:
    return 5 * _nbytes(kw["gate"])       # read dy, gate, up; write dgate, dup
