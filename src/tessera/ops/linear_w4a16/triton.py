"""Triton kernel of linear_w4a16 (``ops/_qlinear_int4/triton.py``)."""
from .._qlinear_int4.triton import DTYPES, forward_w4a16 as forward  # noqa: F401
