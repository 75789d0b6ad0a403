"""Triton kernel of linear_w4a8 (``ops/_qlinear_int4/triton.py``)."""
from .._qlinear_int4.triton import DTYPES, forward_w4a8 as forward  # noqa: F401
