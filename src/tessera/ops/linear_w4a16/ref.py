"""``reference`` backend of linear_w4a16: the float64 reference cast to x's dtype."""
from .._qlinear_int4.ref import DTYPES, forward_w4a16 as forward, w4a16_eager, w4a16_ref  # noqa: F401
