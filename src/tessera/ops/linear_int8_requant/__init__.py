"""Integer-only fully connected layer ``tessera.linear_int8_requant`` (TFLite quantized FC).

    acc[m, n] = sum_k (x[m, k] - x_zp) * w[n, k] + bias[n]           exact integers
    y[m, n]   = requantize(acc[m, n], multiplier[n], shift[n], out_zp, qmin, qmax)

x int8 [..., K] with zero point ``x_zero_point`` (asymmetric activations), w int8 [N, K]
symmetric per output channel (its float scale lives in the multiplier), bias int32 [N] (or
None), multiplier / shift int32 per tensor or per channel (``tessera.requantize``'s rules and
rounding; a fused ReLU is qmin = out_zp).  The int32 pipeline: acc is exact in int64 and
saturated to int32 before requantizing (TFLite's int32 acc + bias cannot exceed it for
K <= 131071 unless the bias is extreme).  x int16 (zero point 0) with int8 weights is CMSIS-NN's
s16 path: int64 accumulators, int64 bias, int16 output, the int64 requantization.

Kernels: one int GEMM on the raw x (ops/_qlinear_int8: AVX512-VNNI VPDPBUSD on CPU, ``tl.dot``
in Triton) and a per-channel int64 offset bias - x_zp * sum_k w folded into the requantization
(exact; x - x_zp spans 9 bits and would not fit the int8 GEMM).  No gradient (integer op).
Roofline: read x, w (1 byte each), write y (1 or 2 bytes).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import SignatureCache, contiguous, direct, plain, rows, shaped
from ..._registry import Case, OpSpec, register_op, select
from .._qlinear_int8 import check_k
from .._requant.ref import linear_forward as _ref_rows
from ..requantize import check_scales, resolve_out

OP = "linear_int8_requant"
X_DTYPES = (torch.int8, torch.int16)


def check_bias(op, bias, N, x_dtype):
    if bias is None:
        return
    want = torch.int32 if x_dtype == torch.int8 else torch.int64
    _checks.tensor(op, "bias", bias, dtypes=(want,))
    if bias.dim() != 1 or bias.shape[0] != N:
        raise ValueError(f"tessera.{op}: argument 'bias' ({_checks.describe(bias)}) must be 1-D {want} of size {N}")


def check_x_zero_point(op, x_zero_point, x):
    if isinstance(x_zero_point, bool) or not isinstance(x_zero_point, (int, torch.SymInt)):
        raise TypeError(f"tessera.{op}: argument 'x_zero_point' must be an int, got {type(x_zero_point).__name__}")
    lo, hi = (-128, 127) if x.dtype == torch.int8 else (0, 0)
    if not lo <= x_zero_point <= hi:
        raise ValueError(f"tessera.{op}: argument 'x_zero_point'={x_zero_point} must lie in [{lo}, {hi}] for "
                         f"{x.dtype} 'x' ({_checks.describe(x)}; int16 activations are symmetric)")


def _check(x, x_zero_point, weight, bias, multiplier, shift, check_values=True):
    _checks.tensor(OP, "x", x, dtypes=X_DTYPES)
    check_k(OP, "x", x)
    check_x_zero_point(OP, x_zero_point, x)
    K = x.shape[-1]
    _checks.tensor(OP, "weight", weight, dtypes=(torch.int8,), min_dim=2)
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must be int8 [N, K] "
                         f"with K = {K} (x.shape[-1])")
    N = weight.shape[0]
    check_bias(OP, bias, N, x.dtype)
    acc_dtype = torch.int32 if x.dtype == torch.int8 else torch.int64
    check_scales(OP, multiplier, shift, N, acc_dtype, "weight", check_values)
    _checks.same_device(OP, "x", x, weight=weight, bias=bias, multiplier=multiplier, shift=shift)


def _impl(x: Tensor, x_zero_point: int, weight: Tensor, bias: Optional[Tensor], multiplier: Tensor, shift: Tensor,
          out_zero_point: int, qmin: int, qmax: int, rounding: str, out_dtype: torch.dtype, backend: str) -> Tensor:
    _check(x, x_zero_point, weight, bias, multiplier, shift)
    mod = select(SPEC, x.device, x.dtype, backend)
    y = mod.forward(rows(x), x_zero_point, contiguous(weight), contiguous(bias), contiguous(multiplier.reshape(-1)),
                    contiguous(shift.reshape(-1)), out_zero_point, qmin, qmax, rounding, out_dtype)
    return shaped(y, (*x.shape[:-1], weight.shape[0]))


_op = torch.library.custom_op(f"tessera::{OP}", mutates_args=())(_impl)
# the public function's normalised arguments per signature (types in the key: True == 1 must not hit
# 1); plain tensors only (a fake / functional tensor under tracing may carry symbolic sizes)
_NORMALIZED = SignatureCache()


@_op.register_fake
def _(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype, backend):
    _check(x, x_zero_point, weight, bias, multiplier, shift, check_values=False)
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype)


def linear_int8_requant(x: Tensor, x_zero_point: int, weight: Tensor, bias: Optional[Tensor], multiplier: Tensor,
                        shift: Tensor, out_zero_point: int = 0, qmin: Optional[int] = None,
                        qmax: Optional[int] = None, *, rounding: Optional[str] = None,
                        out_dtype: Optional[torch.dtype] = None, backend: Optional[str] = None) -> Tensor:
    """Integer-only linear: requantize((x - x_zp) @ w.T + bias) (module docstring)."""
    key = None
    if plain(x, weight):   # the normalisation below depends only on these: remembered per signature
        key = (x.dtype, type(out_zero_point), out_zero_point, type(qmin), qmin, type(qmax), qmax, rounding, out_dtype,
               backend)
        hit = _NORMALIZED.lookup(key)
        if hit is not None and plain(multiplier, shift) and (bias is None or plain(bias)):
            return direct(_op, _impl, x, weight, bias, multiplier, shift)(
                x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, *hit)
    _checks.python_types(OP, {"x": x, "weight": weight, "bias": bias, "multiplier": multiplier, "shift": shift})
    for name, t in (("weight", weight), ("multiplier", multiplier), ("shift", shift)):
        if t is None:
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got NoneType")
    _checks.tensor(OP, "x", x, dtypes=X_DTYPES)
    acc_like = x.new_empty(0, dtype=torch.int32 if x.dtype == torch.int8 else torch.int64)
    if out_dtype is None and x.dtype == torch.int16:
        out_dtype = torch.int16
    out_dtype, qmin, qmax, rounding = resolve_out(acc_like, out_zero_point, qmin, qmax, rounding, out_dtype, OP)
    rest = (qmin, qmax, rounding, out_dtype, _checks.backend_arg(OP, backend))
    if key is not None:
        _NORMALIZED.store(key, rest)
    return direct(_op, _impl, x, weight, bias, multiplier, shift)(
        x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, *rest)


def _ref(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point=0, qmin=None, qmax=None, *,
         rounding=None, out_dtype=None):
    acc_like = x.new_empty(0, dtype=torch.int32 if x.dtype == torch.int8 else torch.int64)
    if out_dtype is None and x.dtype == torch.int16:
        out_dtype = torch.int16
    out_dtype, qmin, qmax, rounding = resolve_out(acc_like, out_zero_point, qmin, qmax, rounding, out_dtype, OP)
    K = x.shape[-1]
    y = _ref_rows(x.reshape(-1, K), x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax,
                  rounding, out_dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def linear_int8_requant_eager(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point=0, qmin=None,
                              qmax=None, *, rounding=None, out_dtype=None):
    """Plain PyTorch: the int64 matmul and the same integer requantization (no fused torch op)."""
    return _ref(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding=rounding,
                out_dtype=out_dtype)


# ---------------------------------------------------------------- spec

def _case(name, lead, K, N, per_channel=True, layout="contig", tags=(), bias=True, relu=False, extreme=False):
    def mk(dtype, device, gen):
        dt = dtype if dtype in X_DTYPES else torch.int8
        lo, hi = (-128, 128) if dt == torch.int8 else (-32768, 32768)
        x = torch.randint(lo, hi, (*lead, K + 4), generator=gen, dtype=dt)
        x = x[..., 2:K + 2] if layout == "rowslice" else x[..., :K].contiguous()
        if layout == "transposed" and len(lead) == 1:
            x = x.t().contiguous().t()
        w = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
        if extreme:
            x.fill_(hi - 1 if dt == torch.int8 else lo)
            w.fill_(-127)
        n = N if per_channel else 1
        mult = torch.randint(2**30, 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        if dt == torch.int8:
            xzp = int(torch.randint(-128, 128, (), generator=gen))
            b = torch.randint(-2**20, 2**20, (N,), generator=gen, dtype=torch.int32) if bias else None
            shift = torch.randint(-14, -6, (n,), generator=gen, dtype=torch.int32)
        else:
            xzp = 0
            b = torch.randint(-2**36, 2**36, (N,), generator=gen, dtype=torch.int64) if bias else None
            shift = torch.randint(-22, -12, (n,), generator=gen, dtype=torch.int32)
        ozp = int(torch.randint(-20, 20, (), generator=gen))
        olo = -128 if dt == torch.int8 else -32768
        qmin, qmax = (ozp, 127 if dt == torch.int8 else 32767) if relu else (olo, 127 if dt == torch.int8 else 32767)
        if not per_channel:
            mult, shift = mult.reshape(()), shift.reshape(())
        kw = {"x": x, "x_zero_point": xzp, "weight": w, "bias": b, "multiplier": mult, "shift": shift,
              "out_zero_point": ozp, "qmin": qmin, "qmax": qmax}
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return Case(name, mk, frozenset(tags))


def _cases():
    return [_case("5x33-n9", (5,), 33, 9), _case("1x7-n5", (1,), 7, 5),
            _case("2x3x123-n65-relu", (2, 3), 123, 65, relu=True), _case("7x64-n17-nobias", (7,), 64, 17, bias=False),
            _case("gemm-33x257-n70-tensor", (33,), 257, 70, per_channel=False), _case("empty-0x16-n5", (0,), 16, 5, tags={"empty"}),
            _case("rowslice-9x77-n20", (9,), 77, 20, layout="rowslice", tags={"layout"}),
            _case("transposed-20x50-n10", (20,), 50, 10, layout="transposed", tags={"layout"}),
            _case("extreme-4x1000-n6", (4,), 1000, 6, tags={"extreme"}, extreme=True)]


def _bytes_fwd(kw):
    x, w = kw["x"], kw["weight"]
    M = x.numel() // x.shape[-1]
    return x.numel() * x.element_size() + w.numel() + M * w.shape[0] * x.element_size()


SPEC = register_op(OpSpec(
    name=OP, fn=linear_int8_requant, ref=_ref, eager=linear_int8_requant_eager,
    kernels={"reference": f"tessera.ops.{OP}.ref", "cpu": f"tessera.ops.{OP}.cpu", "triton": f"tessera.ops.{OP}.triton"},
    cases=_cases(), grad_inputs=(), dtypes=X_DTYPES,
    bytes_fwd=_bytes_fwd, flops_fwd=lambda kw: 2 * (kw["x"].numel()) * kw["weight"].shape[0],
    bound=lambda kw: "compute" if kw["x"].numel() // kw["x"].shape[-1] >= 64 else "read", compute_dtype="int8",
    bench_cases=[_case(f"M{m}-K{k}-N{n}", (m,), k, n) for m, k, n in ((1, 4096, 4096), (256, 4096, 4096))],
    fuzz="test_requantize.py", scalar_ok=("multiplier", "shift"),
))
