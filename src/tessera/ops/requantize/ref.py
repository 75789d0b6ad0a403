"""requantize reference backend (exact int64 arithmetic; see ops/_requant/ref.py)."""
from .._requant.ref import DTYPES, requantize_ref  # noqa: F401


def forward(acc, multiplier, shift, zero_point, qmin, qmax, rounding, out_dtype):
    return requantize_ref(acc, multiplier, shift, zero_point, qmin, qmax, rounding=rounding, out_dtype=out_dtype)


def backward(*args):
    raise NotImplementedError("requantize has no gradient (integer op)")
