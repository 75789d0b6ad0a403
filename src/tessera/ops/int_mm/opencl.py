"""int_mm opencl kernel module (launcher in ops/_qlinear_int8/opencl.py)."""
from .._qlinear_int8.opencl import INT_DTYPES as DTYPES  # noqa: F401
from .._qlinear_int8.opencl import int_mm_forward as forward  # noqa: F401


def backward(*args):
    raise NotImplementedError("int_mm has no gradient (integer op)")
