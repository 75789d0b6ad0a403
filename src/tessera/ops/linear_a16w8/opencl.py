"""linear_a16w8 opencl kernel module (shared code in ops/_qlinear_int8/opencl.py)."""
from .._qlinear_int8 import opencl as _k
from .._qlinear_int8.ref import DTYPES  # noqa: F401


def forward(x, weight, weight_scale, bias, activation):
    return _k.linear_forward(x, weight, weight_scale, bias, activation, 16)


def backward(*args):
    raise NotImplementedError("linear_a16w8 has no gradient (inference op)")
