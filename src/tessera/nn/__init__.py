"""Drop-in ``torch.nn`` modules backed by tessera's fused ops.

=================  ==========================  ===========================================
tessera.nn         replaces                    notes
=================  ==========================  ===========================================
``RMSNorm``        ``torch.nn.RMSNorm``        same parameter names and ``state_dict``
                                               (``weight``); ``forward(x, residual=None)``
``LayerNorm``      ``torch.nn.LayerNorm``      same ``state_dict`` (``weight``, ``bias``);
                                               ``forward(x, residual=None)``
``GELU``           ``torch.nn.GELU``           ``approximate="none"`` / ``"tanh"``
``SiLU``           ``torch.nn.SiLU``
``SwiGLU``         ``silu(gate) * up``         ``forward(gate, up)`` or ``forward(x)``
``GEGLU``          ``gelu(gate) * up``         ``forward(gate, up)`` or ``forward(x)``
``Softmax``        ``torch.nn.Softmax``        ``dim=-1`` by default
=================  ==========================  ===========================================

Fused residual path of the norms: ``norm(x, residual)`` returns ``(y, h)`` with
``h = x + residual`` (the updated residual stream, rounded to x's dtype) and
``y = norm(h)``, in one pass over memory -- the pre-norm transformer block's
``h = x + attn(x); y = norm(h)`` without a separate add.

Gated activations given one tensor split it in two along the last dim with
``x.chunk(2, dim=-1)``: the **first half is the gate**, the second half is
``up`` (the layout of a fused ``[W_gate; W_up]`` projection, as in Llama-style
MLPs).  Both halves are views, so no copy is made.  Note that
``torch.nn.GLU`` is different: it gates the first half with the second.

``normalized_shape`` of the norms may be an int or a tuple: several trailing
dims are normalised together by viewing them as one (the math is identical).
The backend is chosen per call like every tessera op (``tessera.use_backend``,
``TESSERA_BACKEND``, device default).  Importing this module compiles nothing.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from ..ops.geglu import geglu
from ..ops.gelu import gelu
from ..ops.layer_norm import layer_norm
from ..ops.rms_norm import rms_norm
from ..ops.silu import silu
from ..ops.softmax import softmax
from ..ops.swiglu import swiglu

__all__ = ["RMSNorm", "LayerNorm", "GELU", "SiLU", "SwiGLU", "GEGLU", "Softmax", "RotaryEmbedding", "QuantLinear"]

_Shape = Union[int, Sequence[int], torch.Size]
_APPROXIMATE = ("none", "tanh")


def _as_shape(cls: str, normalized_shape: _Shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    shape = tuple(int(s) for s in normalized_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"tessera.nn.{cls}: normalized_shape={normalized_shape!r} must be a positive int "
                         "or a non-empty tuple of positive ints")
    return shape


class _Norm(torch.nn.Module):
    """Shared plumbing: shape checks and flattening of multi-dim ``normalized_shape``."""

    def _flat(self, t: Optional[Tensor], name: str) -> Optional[Tensor]:
        if t is None:
            return None
        k = len(self.normalized_shape)
        if tuple(t.shape[t.dim() - k:]) != self.normalized_shape or t.dim() < k:
            raise ValueError(f"tessera.nn.{type(self).__name__}: '{name}' of shape {tuple(t.shape)} does not end "
                             f"with normalized_shape {self.normalized_shape}")
        return t if k == 1 else t.reshape(*t.shape[:t.dim() - k], -1)

    def _param(self, p: Optional[Tensor]) -> Optional[Tensor]:
        return p if p is None or len(self.normalized_shape) == 1 else p.reshape(-1)

    def _out(self, x: Tensor, out):
        if len(self.normalized_shape) == 1:
            return out
        if isinstance(out, tuple):
            return tuple(o.view(x.shape) for o in out)
        return out.view(x.shape)

    def extra_repr(self) -> str:
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)


class RMSNorm(_Norm):
    """``torch.nn.RMSNorm`` on ``tessera.rms_norm``.

    ``eps`` defaults to 1e-6 (``torch.nn.RMSNorm``'s default ``None`` means the
    input dtype's machine epsilon; pass ``eps=None`` for that behaviour).
    ``forward(x)`` returns ``y``; ``forward(x, residual)`` returns ``(y, x + residual)``.
    """

    def __init__(self, normalized_shape: _Shape, eps: Optional[float] = 1e-6, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _as_shape("RMSNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None):
        eps = torch.finfo(x.dtype).eps if self.eps is None and x.is_floating_point() else self.eps
        out = rms_norm(self._flat(x, "x"), self._param(self.weight), eps, self._flat(residual, "residual"))
        return self._out(x, out)


class LayerNorm(_Norm):
    """``torch.nn.LayerNorm`` on ``tessera.layer_norm`` (same ``weight``/``bias`` parameters).

    ``forward(x)`` returns ``y``; ``forward(x, residual)`` returns ``(y, x + residual)``.
    """

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _as_shape("LayerNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        def param(present: bool):
            return (torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
                    if present else None)
        # register_parameter(name, None) keeps the attribute (as torch.nn.LayerNorm does)
        self.register_parameter("weight", param(elementwise_affine))
        self.register_parameter("bias", param(elementwise_affine and bias))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None):
        out = layer_norm(self._flat(x, "x"), self._param(self.weight), self._param(self.bias), self.eps,
                         self._flat(residual, "residual"))
        return self._out(x, out)


def _check_approximate(cls: str, approximate: str) -> str:
    if approximate not in _APPROXIMATE:
        raise ValueError(f"tessera.nn.{cls}: approximate={approximate!r} is not supported; "
                         f"expected one of {_APPROXIMATE}")
    return approximate


class GELU(torch.nn.Module):
    """``torch.nn.GELU`` on ``tessera.gelu`` (``approximate="none"`` is the erf form)."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = _check_approximate("GELU", approximate)

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(torch.nn.Module):
    """``torch.nn.SiLU`` on ``tessera.silu``; ``inplace=True`` writes the result back into ``x``."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        y = silu(x)
        return x.copy_(y) if self.inplace else y

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


def _split(cls: str, gate: Tensor, up: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    if up is not None:
        return gate, up
    if not isinstance(gate, Tensor) or gate.dim() == 0 or gate.shape[-1] % 2:
        shape = tuple(gate.shape) if isinstance(gate, Tensor) else type(gate).__name__
        raise ValueError(f"tessera.nn.{cls}: a single input is split in two along the last dim "
                         f"(first half = gate, second half = up); it needs an even last dim, got {shape}")
    return gate.chunk(2, dim=-1)


class SwiGLU(torch.nn.Module):
    """``silu(gate) * up`` on ``tessera.swiglu``.

    ``forward(gate, up)``, or ``forward(x)`` with ``gate, up = x.chunk(2, dim=-1)``
    (first half is the gate; views, no copy).
    """

    def forward(self, gate: Tensor, up: Optional[Tensor] = None) -> Tensor:
        return swiglu(*_split("SwiGLU", gate, up))


class GEGLU(torch.nn.Module):
    """``gelu(gate, approximate) * up`` on ``tessera.geglu``; inputs as :class:`SwiGLU`."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = _check_approximate("GEGLU", approximate)

    def forward(self, gate: Tensor, up: Optional[Tensor] = None) -> Tensor:
        g, u = _split("GEGLU", gate, up)
        return geglu(g, u, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(torch.nn.Module):
    """``torch.nn.Softmax`` on ``tessera.softmax`` (``dim`` defaults to the last dim)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


from ..ops.rope.module import RotaryEmbedding  # noqa: E402,F401  (cos/sin buffers + tessera.rope)
from .quant_linear import QuantLinear  # noqa: E402,F401  (quantised inference linear: tessera.quant recipes)
from .conv import Conv2d, fold_batchnorm  # noqa: E402,F401  (tessera.conv2d layer; Conv2d+BatchNorm2d folding)
__all__ += ["Conv2d", "fold_batchnorm"]
