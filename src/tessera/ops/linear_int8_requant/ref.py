"""linear_int8_requant reference backend (exact int64; ops/_requant/ref.py)."""
import torch

from .._requant.ref import linear_forward as forward  # noqa: F401

DTYPES = (torch.int8, torch.int16)   # the dtypes of x


def backward(*args):
    raise NotImplementedError("linear_int8_requant has no gradient (integer op)")
