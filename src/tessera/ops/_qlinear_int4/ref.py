"""Float64 references and plain-PyTorch baselines of the int4 linears.

    W4A16:  y = act(x @ ((q - z) * s).T + bias)
    W4A8:   (qx, sx) = contract.quantize_rows(x, int8)                  per token, fp32 rules
            acc_g    = sum_{k in g} qx[k] * (q[k] - z_g)                exact integers
            y        = act(sx * sum_g acc_g * s_g + bias)

The dequantised weight (q - z) * s is exact in float64 (a small integer times an fp32 value),
so the references are exact up to the final float64 rounding.  The ``eager`` baselines are
what a user writes in plain PyTorch in x's dtype: dequantise the weight to x.dtype and call
``F.linear`` (W4A8 first fake-quantises x per token the same way).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends.reference import up
from ...quant import contract
from .._qlinear_int8.ref import activate  # the epilogue activations shared by the quantized linears
from . import dequantize_weight, unpack_int4


def _codes_minus_zero(weight, weight_zero, group_size):
    """(q - z) as float64 [N, K] (exact small integers); integer inputs given as floats (a generic
    harness upcasting every tensor) are read back as their uint8 bytes."""
    q = unpack_int4(weight.to(torch.uint8)).double()
    z = 8.0 if weight_zero is None else weight_zero.double().repeat_interleave(group_size, 1)
    return q - z


def w4a16_ref(x, weight, weight_scale, weight_zero=None, group_size=128, bias=None, activation=None):
    """Float64 reference of ``linear_w4a16``."""
    w = _codes_minus_zero(weight, weight_zero, group_size) * up(weight_scale).repeat_interleave(group_size, 1)
    y = up(x) @ w.T
    if bias is not None:
        y = y + up(bias)
    return activate(y, activation)


def w4a8_accumulators(x, weight, weight_zero, group_size):
    """Exact per-group integer accumulators (as float64 [.., N, K/g]) and the token scales sx."""
    qx, sx = contract.quantize_rows(x, torch.int8)
    K = x.shape[-1]
    G = K // group_size
    wz = _codes_minus_zero(weight, weight_zero, group_size)                     # [N, K]
    qg = qx.double().reshape(*qx.shape[:-1], 1, G, group_size)
    acc = (qg * wz.reshape(wz.shape[0], G, group_size)).sum(-1)               # [..., N, G], exact
    return acc, sx


def w4a8_ref(x, weight, weight_scale, weight_zero=None, group_size=128, bias=None, activation=None):
    """Float64 reference of ``linear_w4a8`` (x quantised by the fp32 contract first)."""
    acc, sx = w4a8_accumulators(x, weight, weight_zero, group_size)
    y = (acc * up(weight_scale)).sum(-1) * up(sx)[..., None]
    if bias is not None:
        y = y + up(bias)
    return activate(y, activation)


def w4a16_eager(x, weight, weight_scale, weight_zero=None, group_size=128, bias=None, activation=None):
    w = dequantize_weight(weight, weight_scale, weight_zero, group_size, x.dtype)
    return activate(F.linear(x, w, None if bias is None else bias.to(x.dtype)), activation)


def w4a8_eager(x, weight, weight_scale, weight_zero=None, group_size=128, bias=None, activation=None):
    qx, sx = contract.quantize_rows(x, torch.int8)
    xd = (qx.float() * sx[..., None]).to(x.dtype)
    w = dequantize_weight(weight, weight_scale, weight_zero, group_size, x.dtype)
    return activate(F.linear(xd, w, None if bias is None else bias.to(x.dtype)), activation)


# ---------------------------------------------------------------- reference backend kernels

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def forward_w4a16(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return w4a16_ref(x, weight, weight_scale, weight_zero, group_size, bias, activation).to(x.dtype)


def forward_w4a8(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return w4a8_ref(x, weight, weight_scale, weight_zero, group_size, bias, activation).to(x.dtype)
