"""linear_fp8 float64 reference, the plain-PyTorch baseline, and the ``reference`` backend.

    qx, sx = quantize x to e4m3 (contract.quantize_rows per token, or per (token, 128-wide
             K block) when the weight is 128x128 block-scaled)          -- fp32, exact
    y      = (qx * sx) @ (weight * weight_scale).T + bias              -- float64
    y      = activation(y)                                             -- float64

The reference dequantises both operands exactly (fp8 and fp32 scales are exact in float64)
and multiplies in float64, so it is the exact value of the kernels' epilogue
``sum_b fp32(acc_b) * (sx_b * sw_b) + bias`` up to the fp32 rounding the kernels add.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backends.reference import up
from ...quant import contract
from .._qlinear_int8.ref import ACTIVATIONS, activate  # noqa: F401  (the epilogue activations shared by the linears)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
BLOCK = 128
XQ = torch.float8_e4m3fn  # activations are always e4m3 (max 448): the finer mantissa


def scale_kind(weight_scale: torch.Tensor) -> str:
    """"tensor" (shape []), "row" (shape [N]) or "block" (shape [ceil(N/128), ceil(K/128)])."""
    return ("tensor", "row", "block")[weight_scale.dim()]


def quantize_x(x2: torch.Tensor, block: bool):
    """The contract's dynamic e4m3 quantisation of rows [M, K]: (q fp8 [M, K], fp32 scale [M, KB])
    with KB = 1 (per token) or ceil(K/128) (per token and 128-wide K block; the last block is
    partial: its missing lanes are zeros, which change neither amax nor the codes)."""
    M, K = x2.shape
    if not block:
        q, s = contract.quantize_rows(x2, XQ)
        return q, s[:, None]
    kb = -(-K // BLOCK)
    pad = torch.zeros(M, kb * BLOCK, dtype=torch.float32, device=x2.device)
    pad[:, :K] = x2.float()
    q, s = contract.quantize_rows(pad.view(M, kb, BLOCK), XQ)
    return q.view(M, kb * BLOCK)[:, :K], s


def dequantize_weight(weight, weight_scale, dtype=torch.float64) -> torch.Tensor:
    """weight * weight_scale (scales expanded to [N, K]) in ``dtype``."""
    N, K = weight.shape
    s = weight_scale.to(dtype)
    kind = scale_kind(weight_scale)
    if kind == "row":
        s = s[:, None]
    elif kind == "block":
        s = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:N, :K]
    return weight.to(dtype) * s


def dequantize_x(x2: torch.Tensor, block: bool) -> torch.Tensor:
    q, s = quantize_x(x2, block)
    s = s.double().repeat_interleave(BLOCK, 1)[:, :x2.shape[1]] if block else s.double()
    return q.double() * s


def linear_fp8_ref(x, weight, weight_scale, bias=None, activation=None):
    """Float64 reference of ``tessera.linear_fp8`` (returns float64 [..., N])."""
    K, N = x.shape[-1], weight.shape[0]
    block = scale_kind(weight_scale) == "block"
    # the quantisation is defined in fp32 (the contract): x's float64 copy holds x's values exactly
    xd = dequantize_x(x.reshape(-1, K).float(), block)
    y = xd @ dequantize_weight(weight, weight_scale).T
    if bias is not None:
        y = y + up(bias)
    return activate(y, activation).reshape(*x.shape[:-1], N)


def linear_fp8_eager(x, weight, weight_scale, bias=None, activation=None):
    """Plain PyTorch in x's dtype: quantise x to e4m3 per token (per 128-wide K block with block
    weight scales) exactly as the kernels do, dequantise both operands to x's dtype, ``F.linear``.
    x is quantised so that the baseline's error is float rounding only, not e4m3's 3-bit-mantissa
    activation noise (which the unquantised baseline made part of the fp16/bf16 allowance)."""
    K = x.shape[-1]
    block = scale_kind(weight_scale) == "block"
    q, s = quantize_x(x.reshape(-1, K).float(), block)
    s = s.repeat_interleave(BLOCK, 1)[:, :K] if block else s
    xd = (q.float() * s).to(x.dtype).reshape(x.shape)
    w = dequantize_weight(weight, weight_scale, torch.float32).to(x.dtype)
    y = F.linear(xd, w, None if bias is None else bias.to(x.dtype))
    return activate(y, activation)


# ---------------------------------------------------------------- reference backend kernels

def forward(x, weight, weight_scale, bias, activation):
    """x: [M, K] row view; returns [M, N] in x.dtype."""
    return linear_fp8_ref(x, weight, weight_scale, bias, activation).to(x.dtype)


def backward(*args):
    raise NotImplementedError("linear_fp8 has no gradient (inference only)")
