"""linear_a16w8 kernel module of the edge-CPU backends (launcher in ops/_qlinear_int8/cross.py)."""
from .._qlinear_int8 import cross as _k
from .._qlinear_int8.ref import DTYPES  # noqa: F401


def forward(x, weight, weight_scale, bias, activation):
    return _k.linear_forward(x, weight, weight_scale, bias, activation, 16)


def backward(*args):
    raise NotImplementedError("linear_a16w8 has no gradient (inference op)")
