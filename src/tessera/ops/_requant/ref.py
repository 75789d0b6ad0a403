"""Int64 references of the integer-only (requantized) pipeline, and the ``reference`` backend.

Every function here is exact integer arithmetic on int64 tensors (no float anywhere), written
from the formulas in ``ops/requantize/__init__.py``'s docstring; tests/golden/gen_requant.py
restates them independently (plain Python integers) and the tests compare both, bit for bit.
"""
from __future__ import annotations

import torch

I32_MIN, I32_MAX = -2**31, 2**31 - 1
ACC_DTYPES = (torch.int32, torch.int64)
OUT_DTYPES = (torch.int8, torch.int16)
DTYPES = OUT_DTYPES            # a requantizing op's "dtype" in the matrix is its output dtype
SHIFT_RANGE = {torch.int32: (-31, 30), torch.int64: (-31, 7)}
CODE_RANGE = {torch.int8: (-128, 127), torch.int16: (-32768, 32767)}   # the codes' dtypes' bounds


def _per_channel(v: torch.Tensor, C: int) -> torch.Tensor:
    """multiplier / shift: one value per tensor (numel 1) or one per channel (last dim)."""
    v = v.reshape(-1).long().cpu()
    return v.expand(C) if v.numel() == 1 else v


def _srdhm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gemmlowp SaturatingRoundingDoublingHighMul: round-half-away-from-zero of a*b / 2^31."""
    ab = a * b
    nudge = torch.where(ab >= 0, torch.full_like(ab, 1 << 30), torch.full_like(ab, 1 - (1 << 30)))
    h = torch.div(ab + nudge, 1 << 31, rounding_mode="trunc")
    return torch.where((a == I32_MIN) & (b == I32_MIN), torch.full_like(h, I32_MAX), h)


def _rdbpot(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """gemmlowp RoundingDivideByPOT: x / 2^e rounded half away from zero (e in 0..31)."""
    mask = (torch.ones_like(e) << e) - 1
    rem = x & mask
    thr = (mask >> 1) + (x < 0).long()
    return (x >> e) + (rem > thr).long()


def multiply_by_quantized_multiplier(acc: torch.Tensor, mult: torch.Tensor, shift: torch.Tensor,
                                     rounding: str) -> torch.Tensor:
    """acc [M, C] int32/int64 -> int64 [M, C] before the zero point (see the op docstring)."""
    a = acc.long()
    if acc.dtype == torch.int64:       # TFLite's int64 MultiplyByQuantizedMultiplier (Q15)
        x = a.clamp(-2**47, 2**47 - 1)
        rm = torch.where(mult < 0x7FFF0000, (mult + (1 << 15)) >> 16, torch.full_like(mult, 0x7FFF))
        t = 15 - shift
        return (x * rm + (torch.ones_like(t) << (t - 1))) >> t
    if rounding == "single":           # CMSIS-NN single rounding: round half up
        t = 31 - shift
        return (a * mult + (torch.ones_like(t) << (t - 1))) >> t
    left = shift.clamp(min=0)
    a = (a << left).clamp(I32_MIN, I32_MAX)
    return _rdbpot(_srdhm(a, mult), (-shift).clamp(min=0))


def requantize_ref(acc, multiplier, shift, zero_point=0, qmin=None, qmax=None, *, rounding="double",
                   out_dtype=None):
    from ..requantize import resolve_out   # the public rules for the defaults (one definition)
    out_dtype, qmin, qmax, rounding = resolve_out(acc, zero_point, qmin, qmax, rounding, out_dtype)
    C = acc.shape[-1] if acc.dim() else 1
    a = acc.cpu().reshape(-1, C)
    r = multiply_by_quantized_multiplier(a, _per_channel(multiplier, C), _per_channel(shift, C), rounding)
    y = (r + int(zero_point)).clamp(qmin, qmax).to(out_dtype)
    return y.reshape(acc.shape).to(acc.device)


def linear_acc(x, x_zero_point, weight, bias):
    """Exact sum_k (x - x_zp) * w + bias in int64, [M, N] for x [M, K], weight [N, K]."""
    acc = (x.cpu().long() - int(x_zero_point)) @ weight.cpu().long().T
    return acc if bias is None else acc + bias.cpu().long()


def saturate_acc(acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The int32 pipeline's accumulator (bias included) saturated to int32 before requantizing."""
    return acc.clamp(I32_MIN, I32_MAX).to(torch.int32) if dtype == torch.int32 else acc


def conv_acc(x, x_zero_point, weight, bias, stride, padding, dilation, groups):
    """Exact int64 convolution, padding taps = x_zero_point (contribute 0): [N, O, Ho, Wo]."""
    xs = x.cpu().double() - float(x_zero_point)   # |values| < 2^17 and sums < 2^53: float64 is exact
    acc = torch.nn.functional.conv2d(xs, weight.cpu().double(), None, stride, padding, dilation, groups)
    acc = acc.round().long()
    return acc if bias is None else acc + bias.cpu().long().view(1, -1, 1, 1)


def requant_rows(acc64, x_dtype, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype):
    """Exact accumulators (int64 [M, C]) -> requantized [M, C]: int8 x saturates them to int32 and
    takes the int32 path; int16 x keeps int64 (TFLite / CMSIS-NN s16)."""
    acc = saturate_acc(acc64, torch.int32 if x_dtype == torch.int8 else torch.int64)
    C = acc.shape[-1]
    r = multiply_by_quantized_multiplier(acc, _per_channel(multiplier, C), _per_channel(shift, C), rounding)
    return (r + int(out_zero_point)).clamp(qmin, qmax).to(out_dtype)


def linear_forward(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype):
    """Reference backend of linear_int8_requant: x [M, K] rows -> [M, N]."""
    acc = linear_acc(x, x_zero_point, weight, bias)
    return requant_rows(acc, x.dtype, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype).to(x.device)


def conv_forward(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype,
                 stride, padding, dilation, groups, Ho, Wo):
    """Reference backend of conv2d_int8: channels-last rows [N*Ho*Wo, O]."""
    acc = conv_acc(x, x_zero_point, weight, bias, stride, padding, dilation, groups)
    O = weight.shape[0]
    rows_ = acc.permute(0, 2, 3, 1).reshape(-1, O)
    return requant_rows(rows_, x.dtype, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype).to(x.device)
