"""Native CPU kernel of linear_w4a8 (``ops/_qlinear_int4/qlinear_int4.c``)."""
from .._qlinear_int4.cpu import DTYPES, forward_w4a8 as forward  # noqa: F401
