"""tessera: fused AI operators with one op contract across backends.

``import tessera`` registers the ``tessera::`` custom ops and nothing else: no
device is initialised, triton is not imported and no native code is compiled
until an op first runs on a backend that needs it.
"""
from __future__ import annotations

from ._quantize import dequantize, quantize
from ._registry import BACKENDS, OPS, BackendError, use_backend
from .memory import alloc_kv_cache
from .ops.append_kv import append_kv
from .ops.conv2d import conv2d
from .ops.attention import attention
from .ops.cross_entropy import cross_entropy
from .ops.decode_attention import decode_attention
from .ops.dequantize import dequantize_blocks
from .ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from .ops.geglu import geglu
from .ops.gelu import gelu
from .ops.int_mm import int_mm
from .ops.layer_norm import layer_norm
from .ops.linear_a16w8 import linear_a16w8
from .ops.linear_fp8 import linear_fp8
from .ops.linear_w4a16 import linear_w4a16
from .ops.linear_w4a8 import linear_w4a8
from .ops.linear_w8a8 import linear_w8a8
from .ops.quantize import quantize_blocks
from .ops.rms_norm import rms_norm
from .ops.rope import rope, rope_cache
from .ops.silu import silu
from .ops.softmax import softmax
from .ops.swiglu import swiglu

__version__ = "0.1.0"

__all__ = ["BACKENDS", "OPS", "BackendError", "use_backend",
           # fused LLM ops
           "alloc_kv_cache", "append_kv", "attention", "decode_attention", "geglu", "gelu", "layer_norm", "rms_norm", "rope",
           "rope_cache", "silu", "softmax", "swiglu",
           # losses (forward writes the gradient; FLCE never materialises the logits)
           "cross_entropy", "fused_linear_cross_entropy",
           # quantization: formats (tessera.quant), the model API and the quantized matmuls
           "quantize", "dequantize", "quantize_blocks", "dequantize_blocks", "int_mm", "linear_w8a8",
           "linear_a16w8", "linear_w4a16", "linear_w4a8", "linear_fp8"]

from . import memory, nn  # noqa: E402,F401  (huge-page buffers; drop-in torch.nn modules; no kernels)
# Hugging Face models onto tessera ops (tessera.patch / unpatch / patched); transformers is imported
# only when patch() runs.  The name `tessera.patch` is the function; the package is tessera/patch/.
from .patch import paged_cache, patch, patched, unpatch  # noqa: E402
__all__ += ["patch", "unpatch", "patched", "paged_cache"]
from .nn.conv import fold_batchnorm  # noqa: E402
__all__ += ["conv2d", "fold_batchnorm"]  # CNN convolution (ops/conv2d, nn/conv.py)
from .ops.requantize import requantize  # noqa: E402  (integer-only pipeline: ops/_requant)
from .ops.linear_int8_requant import linear_int8_requant  # noqa: E402
from .ops.conv2d_int8 import conv2d_int8  # noqa: E402
from .ops.add_int8 import add_int8  # noqa: E402
from .ops.max_pool2d_int8 import max_pool2d_int8  # noqa: E402
__all__ += ["requantize", "linear_int8_requant", "conv2d_int8", "add_int8", "max_pool2d_int8"]
