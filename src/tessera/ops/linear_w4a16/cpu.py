"""Native CPU kernel of linear_w4a16 (``ops/_qlinear_int4/qlinear_int4.c``)."""
from .._qlinear_int4.cpu import DTYPES, forward_w4a16 as forward  # noqa: F401
