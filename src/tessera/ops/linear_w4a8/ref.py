"""``reference`` backend of linear_w4a8: the float64 reference cast to x's dtype."""
from .._qlinear_int4.ref import DTYPES, forward_w4a8 as forward, w4a8_eager, w4a8_ref  # noqa: F401
