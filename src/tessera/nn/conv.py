"""``tessera.nn.Conv2d`` (drop-in for ``torch.nn.Conv2d`` with an optional fused activation) and
``tessera.fold_batchnorm`` (Conv2d + BatchNorm2d folded into one conv for inference).

Folding (eval-mode BatchNorm, running statistics): with s = gamma / sqrt(running_var + eps),
    W' = W * s[:, None, None, None],    b' = (b - running_mean) * s + beta
so ``bn(conv(x)) == conv'(x)`` up to rounding; the fold is computed in float64 and cast
back to the conv's dtype.  Importing this module compiles nothing.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..ops.conv2d import conv2d
from ..ops.conv2d.ref import ACTIVATIONS


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by ``tessera.conv2d``: same constructor, parameters and
    ``state_dict``, plus ``activation`` (None, "relu", "relu6", "silu", "gelu") fused into the
    epilogue.  ``padding_mode`` must be "zeros" (the other modes pad by copying, not in the kernel)."""

    def __init__(self, *args, activation: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.padding_mode != "zeros":
            raise ValueError(f"tessera.nn.Conv2d: padding_mode={self.padding_mode!r} is not supported; "
                             "expected 'zeros'")
        if activation not in ACTIVATIONS:
            raise ValueError(f"tessera.nn.Conv2d: activation={activation!r}; expected one of {ACTIVATIONS}")
        self.activation = activation

    @classmethod
    def from_torch(cls, conv: torch.nn.Conv2d, activation: Optional[str] = None) -> "Conv2d":
        """A tessera Conv2d sharing ``conv``'s parameters (no copy)."""
        padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, padding, conv.dilation,
                  conv.groups, bias=conv.bias is not None, padding_mode=conv.padding_mode, device="meta",
                  activation=activation)
        new.weight = conv.weight
        new.bias = conv.bias
        new.train(conv.training)
        return new

    def forward(self, x: Tensor) -> Tensor:
        padding = self.padding if isinstance(self.padding, str) else tuple(self.padding)
        return conv2d(x, self.weight, self.bias, tuple(self.stride), padding, tuple(self.dilation), self.groups,
                      self.activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")


def _fold(conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d) -> Conv2d:
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("tessera.fold_batchnorm: BatchNorm2d without running statistics cannot be folded")
    w = conv.weight.detach().double()
    s = torch.rsqrt(bn.running_var.double() + bn.eps)
    if bn.weight is not None:
        s = s * bn.weight.detach().double()
    b = conv.bias.detach().double() if conv.bias is not None else torch.zeros_like(s)
    b = (b - bn.running_mean.double()) * s
    if bn.bias is not None:
        b = b + bn.bias.detach().double()
    padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
    out = Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, padding, conv.dilation,
                 conv.groups, bias=True, device=conv.weight.device, dtype=conv.weight.dtype,
                 activation=getattr(conv, "activation", None))
    with torch.no_grad():
        out.weight.copy_(w * s[:, None, None, None])
        out.bias.copy_(b)
    return out


def fold_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every ``Conv2d`` immediately followed by a ``BatchNorm2d`` (consecutive children of one
    module, e.g. in an ``nn.Sequential``, or attributes named like torchvision's ``conv1``/``bn1``)
    into one ``tessera.nn.Conv2d``; the BatchNorm becomes ``nn.Identity``.  Other ``torch.nn.Conv2d``
    modules become ``tessera.nn.Conv2d`` sharing their parameters.  For inference: the model must be
    in eval mode (folding uses the running statistics).  Modifies ``model`` in place and returns it."""
    if model.training:
        raise ValueError("tessera.fold_batchnorm: call model.eval() first (folding uses the running statistics "
                         "of BatchNorm2d, which training mode does not)")
    _fold_children(model)
    return model


def _fold_children(module: torch.nn.Module) -> None:
    names = list(module._modules)
    prev = None
    for name in names:
        child = module._modules[name]
        if child is None:
            continue
        if isinstance(child, torch.nn.BatchNorm2d) and prev is not None:
            pname = prev
            conv = module._modules[pname]
            if conv.out_channels == child.num_features:
                module._modules[pname] = _fold(conv, child)
                module._modules[name] = torch.nn.Identity()
                prev = None
                continue
        prev = None
        if isinstance(child, torch.nn.Conv2d) and child.padding_mode == "zeros":
            # torchvision names (conv1, bn1): the pairing is conv<k> -> bn<k>
            prev = name
            bn_name = name.replace("conv", "bn") if "conv" in name else None
            if bn_name and bn_name != name and isinstance(module._modules.get(bn_name), torch.nn.BatchNorm2d) \
                    and names.index(bn_name) != names.index(name) + 1:
                module._modules[name] = _fold(child, module._modules[bn_name])
                module._modules[bn_name] = torch.nn.Identity()
                prev = None
                continue
            if not isinstance(child, Conv2d):
                module._modules[name] = Conv2d.from_torch(child)
        else:
            _fold_children(child)
