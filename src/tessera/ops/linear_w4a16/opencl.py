"""opencl kernel module of linear_w4a16 (ops/_qlinear_int4/qlinear_int4.cl)."""
from .._qlinear_int4.opencl import DTYPES, forward_w4a16 as forward  # noqa: F401


def backward(*args):
    raise NotImplementedError("linear_w4a16 has no gradient (inference op)")
