"""Integer-only elementwise add ``tessera.add_int8`` (TFLite's quantized ADD, CMSIS-NN
``arm_elementwise_add_s8`` / ``_s16``): the residual add of a quantized ResNet / MobileNetV2.

    sa  = (a - a_zp) * 2^left_shift                   exact int32 (|a - a_zp| * 2^left_shift < 2^31)
    ra  = MBQM(sa, a_multiplier, a_shift)             gemmlowp double rounding (tessera.requantize)
    rb  = MBQM((b - b_zp) * 2^left_shift, b_multiplier, b_shift)
    raw = saturate_int32(ra + rb)                     (TFLite's int32 sum; it cannot wrap for the
                                                       multipliers below 1 of its Prepare)
    y   = clamp(MBQM(raw, out_multiplier, out_shift) + out_zp, qmin, qmax)

MBQM(x, m, s) is ``tessera.requantize``'s rounding="double" (SaturatingRoundingDoublingHighMul
then RoundingDivideByPOT; written out in ops/requantize/__init__.py), so every step is exact
integer arithmetic and every backend gives the same bits (golden vectors:
tests/golden/gen_requant.py).  The left shift gives the two scaled inputs 20 (int8) or 15 (int16)
bits of headroom before their rounding, TFLite's defaults; any ``left_shift`` with
max|x - zp| * 2^left_shift < 2^31 is accepted (up to 23 for int8, 15 for int16).

Parameters are per tensor, as in TFLite.  :func:`tessera.quant.add_int8_params` derives them from
the three float scales the way TFLite's Prepare does (2 * max(s_a, s_b) as the common scale);
multiplier / shift follow the TFLite convention (real = m * 2^(shift - 31), shift > 0: left).
``a`` and ``b`` have the same integer dtype (int8 or int16, the output's) and broadcast; the output
is channels-last when ``a`` is a 4-D channels-last tensor of the output's shape, else contiguous.
No gradient (integer op).  Roofline: read a and b, write y (1 or 2 bytes each).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct
from ..._registry import select
from .._requant.ref import CODE_RANGE, I32_MAX, I32_MIN, SHIFT_RANGE
from .ref import DTYPES, add_codes

OP = "add_int8"
LEFT_SHIFT = {torch.int8: 20, torch.int16: 15}   # TFLite's (kernels/add.cc, general int8 / int16 path)


def _int(name, v, lo, hi, what=""):
    if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
        raise TypeError(f"tessera.{OP}: argument '{name}' must be an int, got {type(v).__name__}")
    if isinstance(v, int) and not lo <= v <= hi:
        raise ValueError(f"tessera.{OP}: argument '{name}'={v} must lie in [{lo}, {hi}]{what}")
    return v


def _check_tensors(a, b):
    _checks.tensor(OP, "a", a, dtypes=DTYPES)
    _checks.tensor(OP, "b", b, dtypes=DTYPES)
    _checks.same_dtype(OP, "a", a, "b", b)
    _checks.same_device(OP, "a", a, b=b)
    if a.shape == b.shape:
        return a.shape
    try:
        return torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise ValueError(f"tessera.{OP}: arguments 'a' ({_checks.describe(a)}) and 'b' ({_checks.describe(b)}) "
                         f"do not broadcast to one shape") from None


def resolve(a, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier, out_shift,
            out_zero_point, qmin, qmax, left_shift):
    """(qmin, qmax, left_shift) with the defaults of a's dtype filled in; every int checked
    (memoised: a model's add repeats one parameter set, and these checks were most of a small call)."""
    args = (a.dtype, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
            out_shift, out_zero_point, qmin, qmax, left_shift)
    if all(v is None or type(v) is int for v in args[1:]):
        return _resolve_ints(*args)
    return _resolve(*args)   # SymInts (torch.compile): checked where they are concrete


def _resolve(dtype, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
             out_shift, out_zero_point, qmin, qmax, left_shift):
    lo, hi = CODE_RANGE[dtype]
    what = f" ({dtype} 'a')"
    for name, v in (("a_zero_point", a_zero_point), ("b_zero_point", b_zero_point),
                    ("out_zero_point", out_zero_point)):
        _int(name, v, lo, hi, what)
    for name, v in (("a_multiplier", a_multiplier), ("b_multiplier", b_multiplier),
                    ("out_multiplier", out_multiplier)):
        _int(name, v, I32_MIN, I32_MAX, " (int32 Q31)")
    s_lo, s_hi = SHIFT_RANGE[torch.int32]
    for name, v in (("a_shift", a_shift), ("b_shift", b_shift), ("out_shift", out_shift)):
        _int(name, v, s_lo, s_hi, " (the int32 path of tessera.requantize)")
    qmin = lo if qmin is None else _int("qmin", qmin, lo, hi, what)
    qmax = hi if qmax is None else _int("qmax", qmax, lo, hi, what)
    if isinstance(qmin, int) and isinstance(qmax, int) and qmin > qmax:
        raise ValueError(f"tessera.{OP}: arguments qmin={qmin}, qmax={qmax} must satisfy qmin <= qmax")
    left_shift = LEFT_SHIFT[dtype] if left_shift is None else _int("left_shift", left_shift, 0, 30)
    if all(isinstance(v, int) for v in (a_zero_point, b_zero_point, left_shift)):
        span = max(hi - min(a_zero_point, b_zero_point), max(a_zero_point, b_zero_point) - lo)
        if span << left_shift > I32_MAX:
            raise ValueError(f"tessera.{OP}: argument 'left_shift'={left_shift} overflows int32 for {dtype} codes "
                             f"with zero points {a_zero_point}, {b_zero_point} (max|x - zp| = {span}); expected "
                             f"max|x - zp| * 2^left_shift < 2^31")
    return qmin, qmax, left_shift


_resolve_ints = functools.lru_cache(maxsize=1024)(_resolve)


def channels_last_out(a: Tensor, shape) -> bool:
    """The output's layout rule (module docstring); a size-1 C or H*W makes both layouts one."""
    return a.dim() == 4 and a.shape == shape and not a.is_contiguous() and \
        a.is_contiguous(memory_format=torch.channels_last)


def _flat(t: Tensor, shape, cl: bool) -> Tensor:
    """t broadcast to ``shape`` as a flat contiguous run in the output's element order."""
    if t.shape != shape:
        t = t.expand(shape)
    if cl:
        t = t.permute(0, 2, 3, 1)
    if not t.is_contiguous():
        t = contiguous(t)
    return t.view(-1)


def _add_int8_impl(a: Tensor, b: Tensor, a_zero_point: int, a_multiplier: int, a_shift: int, b_zero_point: int,
                   b_multiplier: int, b_shift: int, out_multiplier: int, out_shift: int, out_zero_point: int,
                   qmin: int, qmax: int, left_shift: int, backend: str) -> Tensor:
    shape = _check_tensors(a, b)
    resolve(a, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier, out_shift,
            out_zero_point, qmin, qmax, left_shift)
    mod = select(SPEC, a.device, a.dtype, backend)
    cl = channels_last_out(a, shape)
    y = mod.forward(_flat(a, shape, cl), _flat(b, shape, cl), a_zero_point, a_multiplier, a_shift, b_zero_point,
                    b_multiplier, b_shift, out_multiplier, out_shift, out_zero_point, qmin, qmax, left_shift)
    if cl:
        n, c, h, w = shape
        return y.view(n, h, w, c).permute(0, 3, 1, 2)
    return y.view(shape)


_add_int8 = torch.library.custom_op("tessera::add_int8", mutates_args=())(_add_int8_impl)


@_add_int8.register_fake
def _(a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier, out_shift,
      out_zero_point, qmin, qmax, left_shift, backend):
    shape = _check_tensors(a, b)
    if channels_last_out(a, shape):
        n, c, h, w = shape
        return a.new_empty((n, h, w, c)).permute(0, 3, 1, 2)
    return a.new_empty(shape)


def add_int8(a: Tensor, a_zero_point: int, a_multiplier: int, a_shift: int, b: Tensor, b_zero_point: int,
             b_multiplier: int, b_shift: int, out_multiplier: int, out_shift: int, out_zero_point: int = 0,
             qmin: Optional[int] = None, qmax: Optional[int] = None, *, left_shift: Optional[int] = None,
             backend: Optional[str] = None) -> Tensor:
    """Integer-only add of two quantized tensors, requantized (module docstring)."""
    _checks.python_types(OP, {"a": a, "b": b})
    _check_tensors(a, b)
    qmin, qmax, left_shift = resolve(a, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift,
                                     out_multiplier, out_shift, out_zero_point, qmin, qmax, left_shift)
    return direct(_add_int8, _add_int8_impl, a, b)(
        a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier, out_shift,
        out_zero_point, qmin, qmax, left_shift, _checks.backend_arg(OP, backend))


def add_int8_ref(a, a_zero_point, a_multiplier, a_shift, b, b_zero_point, b_multiplier, b_shift, out_multiplier,
                 out_shift, out_zero_point=0, qmin=None, qmax=None, *, left_shift=None):
    """The exact int64 reference (ref.py) with the public defaults."""
    shape = _check_tensors(a, b)
    qmin, qmax, left_shift = resolve(a, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift,
                                     out_multiplier, out_shift, out_zero_point, qmin, qmax, left_shift)
    y = add_codes(a.expand(shape), b.expand(shape), a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier,
                  b_shift, out_multiplier, out_shift, out_zero_point, qmin, qmax, left_shift)
    return y.to(a.dtype).to(a.device)


from . import spec as _spec  # noqa: E402  (registers the spec; needs the functions above)

SPEC = _spec.SPEC
