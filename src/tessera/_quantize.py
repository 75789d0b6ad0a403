"""``tessera.quantize`` / ``tessera.dequantize``: one name for tensors and for models.

* ``tessera.quantize(model, "w4a16-g128")`` -- replaces the model's ``nn.Linear`` layers in
  place by ``tessera.nn.QuantLinear`` (recipes in ``tessera.quant.model``) and returns the
  model itself (as torchao's ``quantize_`` users expect: ``model = tessera.quantize(model, r)``
  works; the static CNN recipes ``int8-static`` / ``a16w8-static`` take ``calibration=[batch, ...]``
  and return a new ``tessera.quant.static.StaticQuantModel``, leaving the float model as it was).
  The report of the layers replaced and the memory saved is the model's
  ``tessera_quant_report`` attribute and is logged at INFO on the ``tessera`` logger;
  ``tessera.quant.quantize_model`` returns it directly;
* ``tessera.quantize(tensor, "int4-g128")`` -- a ``QTensor`` in that named format
  (``tessera.quant.formats``), bit-exact on every backend.
"""
from __future__ import annotations

import logging

import torch

_log = logging.getLogger("tessera")


def quantize(obj, recipe_or_format: str, **kwargs):
    if isinstance(obj, torch.nn.Module):
        from .quant.model import quantize_model
        report = quantize_model(obj, recipe_or_format, **kwargs)  # also sets obj.tessera_quant_report
        _log.info("%s", report)
        return obj if report.model is None else report.model   # static recipes: a new model
    if isinstance(obj, torch.Tensor):
        from .quant import quantize as quantize_tensor
        return quantize_tensor(obj, recipe_or_format, **kwargs)
    raise TypeError(f"tessera.quantize: expected an nn.Module (with a recipe) or a Tensor (with a format) "
                    f"as the first argument, got {type(obj).__name__}")


def dequantize(qtensor, dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor:
    """The float tensor a ``QTensor`` stands for: ``(q - zero) * scale`` in fp32, then ``dtype``."""
    from .quant import dequantize as dequantize_tensor
    return dequantize_tensor(qtensor, dtype, **kwargs)
