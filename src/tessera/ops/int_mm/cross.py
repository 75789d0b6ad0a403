"""int_mm kernel module of the edge-CPU backends (launcher in ops/_qlinear_int8/cross.py)."""
from .._qlinear_int8.cross import int_mm_forward as forward  # noqa: F401
from .._qlinear_int8.ref import INT_DTYPES as DTYPES  # noqa: F401


def backward(*args):
    raise NotImplementedError("int_mm has no gradient (integer op)")
