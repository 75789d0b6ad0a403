"""Fixed-point requantization ``tessera.requantize`` (TFLite / gemmlowp / CMSIS-NN semantics).

    out = clamp(MBQM(acc, multiplier, shift) + zero_point, qmin, qmax)       (int8 or int16)

``acc`` int32 (or int64: the int16-activation path), ``multiplier`` int32 Q31 (the real scale is
multiplier * 2^(shift - 31)), ``shift`` int32 in TFLite's convention (> 0: left, < 0: right);
both hold one value (per tensor) or one per channel of the last dim of ``acc``.  Every step is
exact integer arithmetic, so every backend gives the same bits (golden vectors:
tests/golden/gen_requant.py, written independently in plain Python integers).

rounding="double" (default for int32 acc; gemmlowp, TFLite MultiplyByQuantizedMultiplier):
    a = saturate_int32(acc * 2^max(shift, 0))
        (TFLite's int32 multiply wraps here, undefined in C; we saturate, identical in range)
    h = SaturatingRoundingDoublingHighMul(a, m)
      = INT32_MAX                                  if a == m == INT32_MIN (the one overflow)
      = trunc((a*m + nudge) / 2^31),  nudge = 2^30 if a*m >= 0 else 1 - 2^30
        i.e. a*m / 2^31 rounded to nearest, ties UP (2.5 -> 3, -2.5 -> -2): the negative nudge
        1 - 2^30 (not -2^30) makes a negative tie round toward zero, so gemmlowp's "away from
        zero" holds for positive ties only (checked against the written-out formula, not assumed)
    r = RoundingDivideByPOT(h, e = max(-shift, 0))
      = (h >> e) + ((h & (2^e - 1)) > ((2^e - 1) >> 1) + (h < 0))
        i.e. h / 2^e rounded half AWAY from zero (-1.5 -> -2, 1.5 -> 2; the + (h < 0) moves the
        threshold for negatives).  Two roundings: a value can round differently from the exact
        acc * scale (5 * 0.5 / 2 -> SRDHM 2.5 -> 3 -> 1.5 -> 2, exact 1.25), as TFLite does
rounding="single" (CMSIS-NN's CMSIS_NN_USE_SINGLE_ROUNDING):
    r = floor((acc*m + 2^(30 - shift)) / 2^(31 - shift))
        i.e. acc*m / 2^(31 - shift) rounded half UP (toward +inf: -2.5 -> -2), one rounding
int64 acc (TFLite's int64 MultiplyByQuantizedMultiplier, CMSIS-NN arm_nn_requantize_s64; the
only rounding of that path, "single"), shift in [-31, 7]:
    x  = clamp(acc, -2^47, 2^47 - 1)               (TFLite's stated input range, made total)
    rm = (m + 2^15) >> 16 if m < 0x7FFF0000 else 0x7FFF        (Q15 multiplier)
    r  = floor((x*rm + 2^(14 - shift)) / 2^(15 - shift))        (round half up)
then out = clamp(r + zero_point, qmin, qmax), all in int64 (no intermediate wrap).

Ranges (checked): shift in [-31, 30] for int32 acc, [-31, 7] for int64; out dtype int8 unless
``out_dtype``/qmin/qmax ask for int16; qmin <= qmax and zero_point inside the out dtype.
Sources: gemmlowp fixedpoint.h, TFLite kernels/internal/common.h, CMSIS-NN arm_nnsupportfunctions.h
(formulas restated from their documentation, not copied).  No gradient (integer op).
Roofline: read acc (4 or 8 bytes), write 1 or 2 bytes per element.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ... import _cases as C
from ..._library import contiguous, direct, per_tensor, rows, shaped
from ..._registry import Case, OpSpec, register_op, select
from .._requant.ref import ACC_DTYPES, CODE_RANGE, OUT_DTYPES, SHIFT_RANGE, requantize_ref

OP = "requantize"
ROUNDINGS = ("double", "single")


def _int(op, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
        raise TypeError(f"tessera.{op}: argument '{name}' must be an int, got {type(v).__name__}")
    return v


def resolve_out(acc, zero_point, qmin, qmax, rounding, out_dtype, op=OP):
    """(out_dtype, qmin, qmax, rounding) with the defaults filled in and checked."""
    _int(op, "zero_point", zero_point)
    if qmin is not None:
        _int(op, "qmin", qmin)
    if qmax is not None:
        _int(op, "qmax", qmax)
    if out_dtype is None:
        lo, hi = CODE_RANGE[torch.int8]
        fits8 = all(v is None or lo <= v <= hi for v in (qmin, qmax))
        out_dtype = torch.int8 if fits8 else torch.int16
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"tessera.{op}: argument 'out_dtype'={out_dtype} is not supported; expected int8 or int16")
    lo, hi = CODE_RANGE[out_dtype]
    qmin = lo if qmin is None else qmin
    qmax = hi if qmax is None else qmax
    if not (lo <= qmin <= qmax <= hi):
        raise ValueError(f"tessera.{op}: arguments qmin={qmin}, qmax={qmax} must satisfy {lo} <= qmin <= qmax <= {hi} "
                         f"(the range of the {out_dtype} output)")
    if not lo <= zero_point <= hi:
        raise ValueError(f"tessera.{op}: argument 'zero_point'={zero_point} must lie in [{lo}, {hi}] ({out_dtype})")
    acc64 = acc.dtype == torch.int64
    if rounding is None:
        rounding = "single" if acc64 else "double"
    _checks.choice(op, "rounding", rounding, ROUNDINGS)
    if acc64 and rounding != "single":
        raise ValueError(f"tessera.{op}: argument 'rounding'={rounding!r} is not available for an int64 'acc' "
                         f"({_checks.describe(acc)}); the int64 path (TFLite / CMSIS-NN s16) rounds once: 'single'")
    return out_dtype, qmin, qmax, rounding


def check_scales(op, multiplier, shift, channels, acc_dtype, acc_name="acc", check_values=True):
    """multiplier / shift: int32, numel 1 or ``channels``, same device checked by the caller;
    shift values inside the range of the accumulator's path (read on the host: they are tiny)."""
    for name, t in (("multiplier", multiplier), ("shift", shift)):
        _checks.tensor(op, name, t, dtypes=(torch.int32,), min_dim=0)
        if t.dim() > 1 or t.numel() not in (1, channels):
            raise ValueError(f"tessera.{op}: argument '{name}' ({_checks.describe(t)}) must hold 1 value (per "
                             f"tensor) or {channels} (one per output channel of '{acc_name}')")
    if check_values:
        check_shift_values(op, shift, acc_dtype)


def check_shift_values(op, shift, acc_dtype):
    """The shift values inside the range of the accumulator's path (``SHIFT_RANGE``)."""
    if shift.numel() and not isinstance(shift, torch._subclasses.FakeTensor) and shift.device.type != "meta":
        lo, hi = SHIFT_RANGE[acc_dtype]
        # read once per shift tensor (per_tensor: rebuilt after an in-place change): two reductions and
        # two host reads were ~5 us of every call of a quantized model's layers
        smin, smax = per_tensor(shift, "shift_range", lambda: (int(shift.min()), int(shift.max())))
        if smin < lo or smax > hi:
            raise ValueError(f"tessera.{op}: argument 'shift' ({_checks.describe(shift)}) has values in "
                             f"[{smin}, {smax}]; expected [{lo}, {hi}] for a {acc_dtype} accumulator")


def _check(acc, multiplier, shift, check_values=True):
    _checks.tensor(OP, "acc", acc, dtypes=ACC_DTYPES, min_dim=1)
    check_scales(OP, multiplier, shift, acc.shape[-1], acc.dtype, check_values=check_values)
    _checks.same_device(OP, "acc", acc, multiplier=multiplier, shift=shift)


def _requantize_impl(acc: Tensor, multiplier: Tensor, shift: Tensor, zero_point: int, qmin: int, qmax: int,
                     rounding: str, out_dtype: torch.dtype, backend: str) -> Tensor:
    _check(acc, multiplier, shift)
    mod = select(SPEC, acc.device, out_dtype, backend)
    out = mod.forward(rows(acc), contiguous(multiplier.reshape(-1)), contiguous(shift.reshape(-1)), zero_point,
                      qmin, qmax, rounding, out_dtype)
    return shaped(out, acc.shape)


_requantize = torch.library.custom_op("tessera::requantize", mutates_args=())(_requantize_impl)


@_requantize.register_fake
def _(acc, multiplier, shift, zero_point, qmin, qmax, rounding, out_dtype, backend):
    _check(acc, multiplier, shift, check_values=False)
    return acc.new_empty(acc.shape, dtype=out_dtype)


def requantize(acc: Tensor, multiplier: Tensor, shift: Tensor, zero_point: int = 0, qmin: Optional[int] = None,
               qmax: Optional[int] = None, *, rounding: Optional[str] = None, out_dtype: Optional[torch.dtype] = None,
               backend: Optional[str] = None) -> Tensor:
    """Fixed-point requantization of int32/int64 accumulators to int8/int16 (module docstring)."""
    _checks.python_types(OP, {"acc": acc, "multiplier": multiplier, "shift": shift})
    for name, t in (("multiplier", multiplier), ("shift", shift)):
        if t is None:
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got NoneType")
    out_dtype, qmin, qmax, rounding = resolve_out(acc, zero_point, qmin, qmax, rounding, out_dtype)
    return direct(_requantize, _requantize_impl, acc, multiplier, shift)(
        acc, multiplier, shift, zero_point, qmin, qmax, rounding, out_dtype, _checks.backend_arg(OP, backend))


def requantize_eager(acc, multiplier, shift, zero_point=0, qmin=None, qmax=None, *, rounding=None, out_dtype=None):
    """Plain PyTorch: the same integer formulas on int64 tensors (there is no fused torch op)."""
    return requantize_ref(acc, multiplier, shift, zero_point, qmin, qmax, rounding=rounding, out_dtype=out_dtype)


# ---------------------------------------------------------------- spec

def _case(name, shape, per_channel, rounding="double", acc64=False, layout="contig", tags=(), zp=0, clamp=None):
    def mk(dtype, device, gen):
        dtype = dtype if dtype in OUT_DTYPES else torch.int8   # generic tests ask for float32
        Cn = shape[-1]
        if acc64:
            acc = torch.randint(-2**40, 2**40, shape, generator=gen, dtype=torch.int64)
            shift = torch.randint(-31, 8, (Cn if per_channel else 1,), generator=gen, dtype=torch.int32)
        else:
            acc = torch.randint(-2**31, 2**31, shape, generator=gen, dtype=torch.int64).to(torch.int32)
            if acc.numel():
                acc.view(-1)[:8] = torch.tensor([0, -1, 2**31 - 1, -2**31, 1 << 20, -(1 << 20) - 1, 3, -3])[
                    :acc.numel()].to(torch.int32)
            shift = torch.randint(-31, 31, (Cn if per_channel else 1,), generator=gen, dtype=torch.int32)
        mult = torch.randint(2**30, 2**31, (Cn if per_channel else 1,), generator=gen, dtype=torch.int64)
        mult = mult.to(torch.int32)
        if not per_channel:
            mult, shift = mult.reshape(()), shift.reshape(())
        if layout == "rowslice":
            acc = torch.cat([acc, acc[..., :3]], -1)[..., :Cn]
        elif layout == "transposed":
            acc = acc.transpose(-1, -2).contiguous().transpose(-1, -2)
        lo, hi = CODE_RANGE[dtype]
        qmin, qmax = clamp if clamp is not None else (lo, hi)
        return {"acc": acc.to(device), "multiplier": mult.to(device), "shift": shift.to(device),
                "zero_point": zp, "qmin": qmin, "qmax": qmax, "rounding": rounding, "out_dtype": dtype}
    return Case(name, mk, frozenset(tags))


def _cases():
    out = []
    for r in ROUNDINGS:
        out += [_case(f"{r}-7x123-ch", (7, 123), True, r, zp=-5), _case(f"{r}-1x7", (1, 7), False, r),
                _case(f"{r}-3x2x1025-ch", (3, 2, 1025), True, r, clamp=(0, 100), zp=3),
                _case(f"{r}-rowslice-9x77", (9, 77), False, r, layout="rowslice", tags={"layout"}),
                _case(f"{r}-transposed-20x33", (20, 33), True, r, layout="transposed", tags={"layout"})]
    out += [_case("int64-9x31", (9, 31), False, "single", acc64=True),
            _case("int64-4x9-ch", (4, 9), True, "single", acc64=True),
            _case("empty-0x16-ch", (0, 16), True, tags={"empty"})]
    return out


def _bytes_fwd(kw):
    acc = kw["acc"]
    return acc.numel() * (acc.element_size() + (2 if kw["out_dtype"] == torch.int16 else 1))


SPEC = register_op(OpSpec(
    name=OP, fn=requantize, ref=requantize_ref, eager=requantize_eager,
    kernels={"reference": "tessera.ops.requantize.ref", "cpu": "tessera.ops.requantize.cpu",
             "triton": "tessera.ops.requantize.triton"},
    cases=_cases(), grad_inputs=(), dtypes=OUT_DTYPES,
    bytes_fwd=_bytes_fwd, flops_fwd=lambda kw: 8 * kw["acc"].numel(),
    bench_cases=[_case("4096x4096-ch", (4096, 4096), True)],
    fuzz="test_requantize.py", scalar_ok=("multiplier", "shift"),
))
