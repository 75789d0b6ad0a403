"""linear_int8_requant native CPU kernel module (ops/_requant/cpu.py)."""
import torch

from .._requant.cpu import linear_forward as forward  # noqa: F401

DTYPES = (torch.int8, torch.int16)   # the dtypes of x


def backward(*args):
    raise NotImplementedError("linear_int8_requant has no gradient (integer op)")
