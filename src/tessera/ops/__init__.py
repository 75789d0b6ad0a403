"""One folder per op (or op family): spec + public function + custom ops in
``__init__.py``, the float64 reference in ``ref.py``, and one kernel module per
backend (``cpu.py`` + ``*.c``, ``triton.py``).  Importing an op registers its
``tessera::`` custom ops and its spec; it compiles nothing and imports no triton.
"""
from . import rms_norm  # noqa: F401
from . import softmax  # noqa: F401
from . import gelu, geglu, silu, swiglu  # noqa: F401  (activation family, shared code in _elementwise)
from . import layer_norm  # noqa: F401
from . import attention  # noqa: F401
from . import rope  # noqa: F401
from . import append_kv, decode_attention  # noqa: F401  (paged KV cache: append + decode)
from . import quantize, dequantize  # noqa: F401  (quantized formats: tessera.quant.formats)
from . import linear_w4a16, linear_w4a8  # noqa: F401  (int4 weights; shared code in _qlinear_int4)
from . import linear_fp8  # noqa: F401  (fp8 x fp8 linear)
from . import int_mm, linear_w8a8, linear_a16w8  # noqa: F401  (int8 matmuls; shared code in _qlinear_int8)
from . import cross_entropy, fused_linear_cross_entropy  # noqa: F401  (losses; FLCE chunks over cross_entropy's kernels)
from . import conv2d  # noqa: F401  (CNN convolution, fused bias + activation)
from . import requantize, linear_int8_requant, conv2d_int8, add_int8, max_pool2d_int8  # noqa: F401  (integer-only pipeline; shared code in _requant)
