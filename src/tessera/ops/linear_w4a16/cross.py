"""linear_w4a16 kernel module of the edge-CPU backends (launcher in ops/_qlinear_int4/cross.py)."""
from .._qlinear_int4.cross import DTYPES, forward_w4a16 as forward  # noqa: F401
