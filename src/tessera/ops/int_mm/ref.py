"""int_mm reference backend (exact int64 matmul; see ops/_qlinear_int8/ref.py)."""
from .._qlinear_int8.ref import INT_DTYPES as DTYPES  # noqa: F401
from .._qlinear_int8.ref import int_mm_forward as forward  # noqa: F401


def backward(*args):
    raise NotImplementedError("int_mm has no gradient (integer op)")
