"""conv2d float64 reference, the plain-PyTorch baseline, and the ``reference`` backend's kernels.

    z = conv2d(x, weight, stride, padding, dilation, groups) + bias
    y = act(z),  act in {None, relu, relu6, silu, gelu (exact, erf)}

Padding is normalised by the public function to four ints ``(top, bottom, left, right)``
("same" pads ``d*(k-1)`` in total, the odd extra on the bottom/right as PyTorch does).
The reference backend's backward is the closed-form gradient: dz = dy * act'(z) with z
recomputed in float64, dx = conv_transpose(dz, weight), dweight = correlation of x with
dz, dbias = sum(dz) (``torch.nn.grad`` helpers on float64, no autograd inside the op).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...backends.reference import up

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTIVATIONS = (None, "relu", "relu6", "silu", "gelu")


def act_fwd(z, activation):
    if activation is None:
        return z
    if activation == "relu":
        return torch.relu(z)
    if activation == "relu6":
        return z.clamp(0.0, 6.0)
    if activation == "silu":
        return F.silu(z)
    return F.gelu(z)


def act_grad(z, activation):
    """d act / dz at z (relu/relu6: 0 at the kinks, as PyTorch's threshold/hardtanh backward)."""
    if activation == "relu":
        return (z > 0).to(z.dtype)
    if activation == "relu6":
        return ((z > 0) & (z < 6)).to(z.dtype)
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2.0)))
    return cdf + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def pad_input(x, pads):
    """x zero-padded by (top, bottom, left, right); F.pad takes (left, right, top, bottom)."""
    t, b, l, r = pads
    return F.pad(x, (l, r, t, b)) if any(pads) else x


def norm_args(x, weight, stride, padding, dilation):
    """(stride pair, (top, bottom, left, right), dilation pair) from the public arguments."""
    from . import normalize
    return normalize(x.shape, weight.shape, stride, padding, dilation)


def conv2d_ref(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """Float64 reference of ``tessera.conv2d`` (returns float64)."""
    s, pads, d = norm_args(x, weight, stride, padding, dilation)
    z = F.conv2d(pad_input(up(x), pads), up(weight), None if bias is None else up(bias), s, 0, d, groups)
    return act_fwd(z, activation)


def conv2d_eager(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """What a user writes: ``F.conv2d`` (oneDNN on this CPU) then the activation, in x's dtype."""
    z = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    if activation is None:
        return z
    return {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "gelu": F.gelu}[activation](z)


# ---------------------------------------------------------------- reference backend kernels
# Signatures shared by every backend: x is 4-D (any strides), weight [Cout, Cin/groups, KH, KW],
# bias [Cout] or None, stride/dilation pairs, pads (top, bottom, left, right); the output has
# x's memory format (channels-last when x is).

def out_format(x):
    return torch.channels_last if is_channels_last(x) else torch.contiguous_format


def is_channels_last(x):
    """x is stored channels-last (NHWC) when its channel stride is the smallest (C > 1)."""
    return x.dim() == 4 and x.shape[1] > 1 and x.stride(1) == 1 and x.stride(3) != 1 and x.stride(3) >= x.shape[1]


def forward(x, weight, bias, stride, pads, dilation, groups, activation):
    z = F.conv2d(pad_input(up(x), pads), up(weight), None if bias is None else up(bias), stride, 0, dilation, groups)
    return act_fwd(z, activation).to(x.dtype).contiguous(memory_format=out_format(x))


def backward(dy, x, weight, bias, stride, pads, dilation, groups, activation, need_bias):
    xp = pad_input(up(x), pads)
    w64 = up(weight)
    dz = up(dy)
    if activation is not None:
        z = F.conv2d(xp, w64, None if bias is None else up(bias), stride, 0, dilation, groups)
        dz = dz * act_grad(z, activation)
    dxp = torch.nn.grad.conv2d_input(xp.shape, w64, dz, stride, 0, dilation, groups)
    t, b, l, r = pads
    dx = dxp[:, :, t:t + x.shape[2], l:l + x.shape[3]]
    dw = torch.nn.grad.conv2d_weight(xp, w64.shape, dz, stride, 0, dilation, groups)
    db = dz.sum((0, 2, 3)).to(torch.float32) if need_bias else None
    return dx.to(x.dtype).contiguous(memory_format=out_format(x)), dw.to(torch.float32), db
