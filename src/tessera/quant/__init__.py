"""tessera.quant: quantised formats, their integer contract and the model API.

``contract`` holds the rules every backend reproduces bit for bit (see its docstring);
``formats`` the named formats, ``QTensor`` and tensor ``quantize`` / ``dequantize``;
``interop`` 4-bit packing and the GPTQ / AWQ / ggml converters.
"""
from __future__ import annotations

from . import contract  # noqa: F401
from .formats import FORMATS, Format, FormatInfo, QTensor, dequantize, format_info, quantize  # noqa: F401
from .interop import (pack_int4, unpack_int4, to_gptq, from_gptq, to_awq, from_awq,  # noqa: F401
                      to_ggml, from_ggml)
from .model import RECIPES, QuantReport, quantize_model  # noqa: F401,E402  (model API: recipes)
from .static import add_int8_params  # noqa: F401,E402  (tessera.add_int8's parameters from float scales)
