"""conv2d_int8 reference backend (exact int64; ops/_requant/ref.py)."""
import torch

from .._requant.ref import conv_forward as forward  # noqa: F401

DTYPES = (torch.int8, torch.int16)   # the dtypes of x


def backward(*args):
    raise NotImplementedError("conv2d_int8 has no gradient (integer op)")
