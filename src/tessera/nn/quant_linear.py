"""``tessera.nn.QuantLinear``: an inference ``nn.Linear`` with quantised weights.

The layer holds buffers only (``weight`` int8 / packed-int4 uint8 / float8_e4m3fn,
``weight_scale`` fp32, ``weight_zero`` uint8 for zero-point recipes, ``bias`` or None), so
``state_dict()`` / ``load_state_dict()`` round-trip bit for bit; the recipe name travels as
the module's extra state and loading a state dict of another recipe raises.  ``forward`` is
one call of the recipe's tessera op (``linear_w8a8``, ``linear_a16w8``, ``linear_w4a16``,
``linear_w4a8``, ``linear_fp8``): the activation quantisation is fused in the op.  Recipes:
``tessera.quant.model``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..quant import model as qm


def _op(name: str):
    from .. import ops  # noqa: F401  (registered by import tessera; imported lazily: no cycle)
    import importlib
    return getattr(importlib.import_module(f"tessera.ops.{name}"), name)


class QuantLinear(torch.nn.Module):
    """``y = x @ dequant(weight).T + bias`` computed by the recipe's quantised op.

    Args: ``in_features``, ``out_features``, ``bias`` (bool), ``recipe`` (a name of
    ``tessera.quant.RECIPES``), ``dtype`` (of the bias), ``device``, ``backend`` (passed to
    every op call; None = automatic).  Buffers start at zero: fill them with
    :meth:`from_linear`, :meth:`load_state_dict` or :meth:`set_weight`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str = "w8a8",
                 dtype: torch.dtype = torch.float32, device=None, backend: Optional[str] = None):
        super().__init__()
        r = qm.get_recipe(recipe, "tessera.nn.QuantLinear")
        for n, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"tessera.nn.QuantLinear: argument '{n}'={v!r} must be a positive int")
        ok, why = qm.fits(r, in_features)
        if not ok:
            raise ValueError(f"tessera.nn.QuantLinear: argument 'in_features' does not fit recipe {r.name!r}: {why}")
        self.in_features, self.out_features, self.recipe, self.backend = in_features, out_features, r.name, backend
        self._r = r
        for name, (shape, dt) in qm.buffer_specs(r, out_features, in_features).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dt, device=device))
        if "weight_zero" not in self._buffers:
            self.weight_zero = None
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    # ------------------------------------------------------------ construction from float layers
    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: str = "w8a8", backend: Optional[str] = None) -> "QuantLinear":
        """Quantise a ``torch.nn.Linear`` (its weight with the recipe; the bias is copied)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"tessera.nn.QuantLinear.from_linear: argument 'linear' must be a torch.nn.Linear, "
                            f"got {type(linear).__name__}")
        w = linear.weight
        dtype = w.dtype if w.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float32
        q = cls(linear.in_features, linear.out_features, linear.bias is not None, recipe, dtype, w.device, backend)
        q.set_weight(w, linear.bias)
        return q

    @torch.no_grad()
    def set_weight(self, weight: Tensor, bias: Optional[Tensor] = None) -> "QuantLinear":
        """Quantise a float [out_features, in_features] weight into the buffers (and copy bias)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"tessera.nn.QuantLinear.set_weight: argument 'weight' has shape {tuple(weight.shape)}, "
                             f"expected {(self.out_features, self.in_features)}")
        for name, t in qm.quantize_weight(weight, self._r).items():
            getattr(self, name).copy_(t)
        if bias is not None and self.bias is not None:
            self.bias.copy_(bias.detach())
        return self

    def dequantized_weight(self) -> Tensor:
        """The fp32 weight the buffers represent."""
        bufs = {n: b for n, b in self._buffers.items() if b is not None}
        return qm.dequantize_weight(bufs, self._r)

    # ------------------------------------------------------------ forward
    def forward(self, x: Tensor) -> Tensor:
        r = self._r
        bias = self.bias
        if bias is not None and bias.dtype not in (torch.float32, x.dtype):
            bias = bias.float()
        if r.kind == "int4":
            return _op(r.op)(x, self.weight, self.weight_scale, self.weight_zero, r.group, bias, None,
                             backend=self.backend)
        return _op(r.op)(x, self.weight, self.weight_scale, bias, None, backend=self.backend)

    # ------------------------------------------------------------ state dict: the recipe travels along
    def get_extra_state(self):
        return {"recipe": self.recipe}

    def set_extra_state(self, state):
        got = state.get("recipe") if isinstance(state, dict) else None
        if got != self.recipe:
            raise ValueError(f"tessera.nn.QuantLinear: state dict was saved with recipe {got!r}, "
                             f"this layer uses {self.recipe!r}")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe!r}")
