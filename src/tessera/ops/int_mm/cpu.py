"""int_mm native CPU kernel module (launcher in ops/_qlinear_int8/cpu.py)."""
from .._qlinear_int8.cpu import INT_DTYPES as DTYPES  # noqa: F401
from .._qlinear_int8.cpu import int_mm_forward as forward  # noqa: F401


def backward(*args):
    raise NotImplementedError("int_mm has no gradient (integer op)")
