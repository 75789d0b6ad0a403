"""int_mm Triton kernel module (kernels in ops/_qlinear_int8/triton.py)."""
from .._qlinear_int8.ref import INT_DTYPES as DTYPES  # noqa: F401
from .._qlinear_int8.triton import int_mm_forward as forward  # noqa: F401


def backward(*args):
    raise NotImplementedError("int_mm has no gradient (integer op)")
