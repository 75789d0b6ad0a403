"""tessera: fused AI operators with one op contract across backends.

``import tessera`` registers the ``tessera::`` custom ops and nothing else: no
device is initialised, triton is not imported and no native code is compiled
until an op first runs on a backend that needs it.
"""
from __future__ import annotations

from ._registry import BACKENDS, OPS, BackendError, use_backend
from .ops.append_kv import append_kv
from .ops.attention import attention
from .ops.decode_attention import decode_attention
from .ops.geglu import geglu
from .ops.gelu import gelu
from .ops.layer_norm import layer_norm
from .ops.rms_norm import rms_norm
from .ops.rope import rope, rope_cache
from .ops.silu import silu
from .ops.softmax import softmax
from .ops.swiglu import swiglu

__version__ = "0.1.0"

__all__ = ["BACKENDS", "OPS", "BackendError", "use_backend",
           "append_kv", "attention", "decode_attention", "geglu", "gelu", "layer_norm", "rms_norm", "silu", "softmax", "swiglu", "rope", "rope_cache"]

from . import nn  # noqa: E402,F401  (drop-in torch.nn modules; imports no kernels)
