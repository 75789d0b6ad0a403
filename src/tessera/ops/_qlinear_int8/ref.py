"""Float64 / int64 references of the int8 matmuls, and the ``reference`` backend's kernels.

    int_mm(a, b)        = a @ b.T exactly (int64), returned as int32 (int8 a) or int64 (int16 a)
    linear_w8a8(x, ...) : qx, sx = quantize_rows(x, int8)    (tessera.quant.contract, fp32 rules)
                          acc    = qx @ weight.T             (exact integers)
                          y      = act(acc * (sx * sw) + bias)
    linear_a16w8        : the same with quantize_rows(x, int16)

The activation quantisation follows the integer contract bit for bit (it is computed with
``contract.quantize_rows`` in fp32); the integer product is exact (int64 matmul on CPU); the
epilogue is float64 here, fp32 in the kernels (y = fp32(acc) * (sx * sw) + bias, then the
activation), so kernels differ from this reference only by a few fp32 roundings.
"""
from __future__ import annotations


import math

import torch

from ...quant import contract

ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
ACT_CODE = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
QTYPE = {8: torch.int8, 16: torch.int16}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.int16)


def activate(y: torch.Tensor, activation) -> torch.Tensor:
    """The epilogue activations of the quantized linears, in y's dtype: the fused torch ops a user
    writes (exact enough in float64 for the references)."""
    if activation is None:
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        if y.dtype == torch.float64:   # the references: Phi(y) = erfc(-y / sqrt2) / 2, no 1 + erf
            # cancellation (torch's gelu gives 0 below y ~ -8.3, where the OpenCL epilogue's erfc gives
            # ~1e-28: a correct value the reference called an error)
            return 0.5 * y * torch.special.erfc(-y * math.sqrt(0.5))
        return torch.nn.functional.gelu(y)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(y)
    raise ValueError(f"unknown activation {activation!r}")


def int_mm_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] int8/int16 @ b [N, K].T in int64 (exact: CPU integer matmul)."""
    return a.cpu().long() @ b.cpu().long().T


def int_mm_ref(a, b):
    """Exact int_mm: int32 for int8 a, int64 for int16 a.  The int64 sums are never wrapped into
    the int32 result silently (torch._int_mm would): a sum outside int32 (only possible past the
    enforced K <= 131071) raises, so the reference cannot agree with a kernel on a wrong value."""
    acc = int_mm_exact(a, b)
    if a.dtype == torch.int8 and acc.numel():
        lo, hi = int(acc.min()), int(acc.max())
        if lo < -2**31 or hi > 2**31 - 1:
            raise ValueError(f"int_mm_ref: int8 sums in [{lo}, {hi}] overflow the int32 result (K = "
                             f"{a.shape[-1]}; K <= 131071 keeps them inside int32)")
    acc = acc.to(a.device)
    return acc.to(torch.int32) if a.dtype == torch.int8 else acc


def _weight_scale(weight_scale: torch.Tensor, N: int) -> torch.Tensor:
    return weight_scale.float().reshape(-1).expand(N) if weight_scale.numel() == 1 else weight_scale.float()


def linear_ref(x, weight, weight_scale, bias=None, activation=None, *, bits=8):
    """Float64 result of the quantised linear (x's leading dims kept, last dim N)."""
    K, N = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, K).float()  # the matrix hands in float64 copies of fp32/bf16/fp16: exact
    qx, sx = contract.quantize_rows(x2, QTYPE[bits])
    acc = int_mm_exact(qx, weight).double().to(x.device)
    s = sx.double()[:, None] * _weight_scale(weight_scale, N).double()[None, :]
    y = acc * s
    if bias is not None:
        y = y + bias.double()
    return activate(y, activation).reshape(*x.shape[:-1], N)


def linear_eager(x, weight, weight_scale, bias=None, activation=None, *, bits=8):
    """What a user writes in plain PyTorch for the same W8A8 / A16W8 recipe, in x.dtype: quantise
    the activations per token exactly as the kernels do (``contract.quantize_rows`` in fp32),
    dequantise both operands to x.dtype and ``F.linear``.  Quantising x here is what makes it a
    baseline of the kernel's *float* error: with x unquantised, its error included the whole
    activation-quantisation noise (~1/254 of each row's amax per int8 element), and the 2x rule
    then admitted kernels that many ulps off."""
    K, N = x.shape[-1], weight.shape[0]
    qx, sx = contract.quantize_rows(x.reshape(-1, K).float(), QTYPE[bits])
    xd = (qx.float() * sx[:, None]).to(x.dtype).reshape(x.shape)
    w = (weight.float() * _weight_scale(weight_scale, N)[:, None]).to(x.dtype)
    y = torch.nn.functional.linear(xd, w, None if bias is None else bias.to(x.dtype))
    return activate(y, activation)


def linear_w8a8_eager(x, weight, weight_scale, bias=None, activation=None):
    return linear_eager(x, weight, weight_scale, bias, activation, bits=8)


def linear_a16w8_eager(x, weight, weight_scale, bias=None, activation=None):
    return linear_eager(x, weight, weight_scale, bias, activation, bits=16)


EAGER = {"linear_w8a8": linear_w8a8_eager, "linear_a16w8": linear_a16w8_eager}


# ---------------------------------------------------------------- reference backend kernels

def int_mm_forward(a, b):
    return int_mm_ref(a, b)


def linear_forward(x, weight, weight_scale, bias, activation, bits):
    """x [M, K] row view, weight [N, K] int8, weight_scale fp32 [N], bias fp32 [N] or None."""
    return linear_ref(x, weight, weight_scale, bias, activation, bits=bits).to(x.dtype)
