"""requantize native CPU kernel module (launcher in ops/_requant/cpu.py, kernel requant.c)."""
from .._requant.cpu import DTYPES, forward  # noqa: F401


def backward(*args):
    raise NotImplementedError("requantize has no gradient (integer op)")
