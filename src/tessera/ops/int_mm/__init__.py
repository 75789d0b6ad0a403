"""Exact integer matmul ``tessera.int_mm(a, b)`` = a @ b.T.

    a int8 [M, K]  x  b int8 [N, K]  ->  int32 [M, N]
    a int16 [M, K] x  b int8 [N, K]  ->  int64 [M, N]

``b`` is in nn.Linear layout (row n = output feature), as the quantised linears' weights.
Bit-exact on every backend and CPU ISA level (integer sums are exact; int8 sums fit int32 for
K <= 131071, which is enforced: 131072 terms (-128) * (-128) sum to 2^31).  CPU: AVX512-VNNI VPDPBUSD / VPDPWSSD micro-kernels with a
portable C fallback (see ``_qlinear_int8/qlinear_int8.c``); Triton: ``tl.dot`` on int8 tiles
(int16 a is split into two int8 halves); OpenCL: ``_qlinear_int8/qlinear_int8.cl`` (a tiled
GEMM / GEMV for GPUs, dot products for CPU devices).  No gradient (integer op).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct, rows
from ..._registry import Case, OpSpec, register_op, select
from .._qlinear_int8 import BENCH_SHAPES, check_int_mm
from .._qlinear_int8.ref import INT_DTYPES, int_mm_ref

OP = "int_mm"


def _int_mm_impl(a: Tensor, b: Tensor, backend: str) -> Tensor:
    check_int_mm(OP, a, b)
    mod = select(SPEC, a.device, a.dtype, backend)
    return mod.forward(rows(a), contiguous(b))


_int_mm = torch.library.custom_op("tessera::int_mm", mutates_args=())(_int_mm_impl)


@_int_mm.register_fake
def _(a, b, backend):
    check_int_mm(OP, a, b)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.int32 if a.dtype == torch.int8 else torch.int64)


def int_mm(a: Tensor, b: Tensor, *, backend: Optional[str] = None) -> Tensor:
    """Exact a @ b.T for int8/int16 ``a`` [M, K] and int8 ``b`` [N, K] (int32 / int64 result)."""
    f = direct(_int_mm, _int_mm_impl, a, b)
    if f is _int_mm or b is None:  # before the schema parser, for clear TypeErrors (the bodies check too)
        _checks.python_types(OP, {"a": a, "b": b})
        if b is None:
            raise TypeError(f"tessera.{OP}: argument 'b' must be a torch.Tensor, got NoneType")
    return f(a, b, _checks.backend_arg(OP, backend))


def int_mm_eager(a, b):
    """Plain PyTorch: torch._int_mm for int8 (CUDA's needs M > 16 and K, N multiples of 8), an
    int64 matmul otherwise (CUDA has none: there a float64 matmul, exact while |sum| < 2^53, which
    int16 x int8 products (< 2^22 each) keep for K < 2^31)."""
    M, K = a.shape
    if a.dtype == torch.int8 and (not a.is_cuda or (M > 16 and K % 8 == 0 and b.shape[0] % 8 == 0)):
        return torch._int_mm(a, b.T)
    if a.is_cuda:
        out = torch.int32 if a.dtype == torch.int8 else torch.int64
        return (a.double() @ b.double().T).to(out)
    return a.long() @ b.long().T


# ---------------------------------------------------------------- spec

def _a_dtype(dtype):
    return dtype if dtype in INT_DTYPES else torch.int8


def _case(name, M, K, N, layout="contig", tags=(), extreme=False):
    def mk(dtype, device, gen):
        dt = _a_dtype(dtype)
        lo, hi = (-128, 128) if dt == torch.int8 else (-32768, 32768)
        if extreme:  # the largest magnitudes (same sign: the sums' extremes)
            a = torch.full((M, K), lo, dtype=dt)
            a[::2] = hi - 1
            b = torch.full((N, K), -128, dtype=torch.int8)
            b[1::2] = 127
        else:
            a = torch.randint(lo, hi, (M, K + 5 if layout == "rowslice" else K), generator=gen, dtype=dt)
            if layout == "rowslice":
                a = a[:, 2:K + 2]
            elif layout == "transposed":
                a = a.t().contiguous().t()
            b = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
        return {"a": a.to(device), "b": b.to(device)}
    return Case(name, mk, frozenset(tags))


def _cases():
    return [_case("1x33-n7", 1, 33, 7), _case("7x123-n65", 7, 123, 65), _case("16x64-n9", 16, 64, 9),
            _case("gemm-33x257-n130", 33, 257, 130), _case("gemm-70x64-n64", 70, 64, 64),
            _case("empty0x64-n5", 0, 64, 5, tags={"empty"}),
            _case("rowslice-9x77-n20", 9, 77, 20, "rowslice", {"layout"}),
            _case("transposed-20x50-n10", 20, 50, 10, "transposed", {"layout"}),
            _case("extreme-6x1000-n6", 6, 1000, 6, tags={"extreme"}),
            _case("extreme-gemm-40x4100-n8", 40, 4100, 8, tags={"extreme", "large"}),
            _case("large-3x4099-n40", 3, 4099, 40, tags={"large"})]


def _bytes_fwd(kw):
    a, b = kw["a"], kw["b"]
    out = 4 if a.dtype == torch.int8 else 8
    return a.numel() * a.element_size() + b.numel() + a.shape[0] * b.shape[0] * out


def _flops_fwd(kw):
    return 2 * kw["a"].shape[0] * kw["a"].shape[1] * kw["b"].shape[0]


SPEC = register_op(OpSpec(
    name=OP, fn=int_mm, ref=int_mm_ref, eager=int_mm_eager,
    kernels={"reference": "tessera.ops.int_mm.ref", "cpu": "tessera.ops.int_mm.cpu",
             "triton": "tessera.ops.int_mm.triton", "opencl": "tessera.ops.int_mm.opencl",
             "cpu:aarch64": "tessera.ops.int_mm.cross", "cpu:riscv64": "tessera.ops.int_mm.cross"},
    cases=_cases(), grad_inputs=(), dtypes=INT_DTYPES,
    bytes_fwd=_bytes_fwd, flops_fwd=_flops_fwd,
    bound=lambda kw: "compute" if kw["a"].shape[0] >= 64 else "read",
    compute_dtype="int8",  # VPDPBUSD (int16 a too: its ceiling is no lower than the int8 peak's)
    bench_cases=[_case(f"M{m}-K{k}-N{n}", m, k, n) for m, k, n in BENCH_SHAPES if m >= 64 or n == 4096],
    fuzz="test_qlinear_int8.py",
))
