"""conv2d_int8 native CPU kernel module (ops/_requant/cpu.py: im2col + VNNI int GEMM + requant.c)."""
import torch

from .._requant.cpu import conv_forward as forward  # noqa: F401
from .._requant.cpu import rows_to_nchw  # noqa: F401  (the output's NCHW copy, _impl)

DTYPES = (torch.int8, torch.int16)   # the dtypes of x


def backward(*args):
    raise NotImplementedError("conv2d_int8 has no gradient (integer op)")
