"""add_int8 reference backend: exact int64 arithmetic (no float anywhere), written from the
formulas in the op's docstring with ``ops/_requant/ref.py``'s MultiplyByQuantizedMultiplier;
tests/golden/gen_requant.py restates them independently in plain Python integers."""
from __future__ import annotations

import torch

from .._requant.ref import I32_MAX, I32_MIN, multiply_by_quantized_multiplier

DTYPES = (torch.int8, torch.int16)


def _scaled(x, zero_point, multiplier, shift, left_shift):
    """MBQM((x - zp) * 2^left_shift, multiplier, shift) with gemmlowp's double rounding."""
    v = (x.long() - int(zero_point)) << int(left_shift)      # |v| < 2^31: the op checks left_shift
    m, s = torch.tensor(int(multiplier)), torch.tensor(int(shift))
    return multiply_by_quantized_multiplier(v.to(torch.int32), m, s, "double")


def add_codes(a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
              out_shift, out_zero_point, qmin, qmax, left_shift):
    """a, b: integer tensors of one broadcast shape (any layout) -> int64 codes, on the CPU."""
    ra = _scaled(a.cpu(), a_zero_point, a_multiplier, a_shift, left_shift)
    rb = _scaled(b.cpu(), b_zero_point, b_multiplier, b_shift, left_shift)
    raw = (ra + rb).clamp(I32_MIN, I32_MAX).to(torch.int32)   # TFLite's int32 sum, saturated
    r = multiply_by_quantized_multiplier(raw, torch.tensor(int(out_multiplier)), torch.tensor(int(out_shift)),
                                         "double")
    return (r + int(out_zero_point)).clamp(int(qmin), int(qmax))


def forward(a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
            out_shift, out_zero_point, qmin, qmax, left_shift):
    """The backends' signature: a, b flat (1-D, same length) -> flat codes of a's dtype."""
    y = add_codes(a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
                  out_shift, out_zero_point, qmin, qmax, left_shift)
    return y.to(a.dtype).to(a.device)


def backward(*args):
    raise NotImplementedError("add_int8 has no gradient (integer op)")
