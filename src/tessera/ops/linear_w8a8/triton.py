"""linear_w8a8 Triton kernel module (kernels in ops/_qlinear_int8/triton.py)."""
from .._qlinear_int8 import triton as _k
from .._qlinear_int8.ref import DTYPES  # noqa: F401


def forward(x, weight, weight_scale, bias, activation):
    return _k.linear_forward(x, weight, weight_scale, bias, activation, 8)


def backward(*args):
    raise NotImplementedError("linear_w8a8 has no gradient (inference op)")
