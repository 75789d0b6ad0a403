"""Quantised linear ``tessera.linear_w8a8(x, weight, weight_scale, bias=None, activation=None)``.

W8A8: int8 per-token activations x int8 weights, int32 accumulation:

    qx, sx = quantize_rows(x, torch.int8)          per token, fused in the kernel (integer contract)
    acc    = qx @ weight.T                        exact integers
    y      = act(fp32(acc) * (sx * sw) + bias)    fp32 epilogue, this order; y in x.dtype

weight int8 [N, K], weight_scale fp32 [N] or [], bias fp32/x.dtype [N] or None, activation
None/"relu"/"gelu"/"gelu_tanh"/"silu".  Formulas, numerics and kernels: ops/_qlinear_int8.
Inference op: no gradient.
"""
from __future__ import annotations

from .._qlinear_int8 import make_linear, register_linear
from .._qlinear_int8.ref import linear_ref

OP = "linear_w8a8"
_holder: dict = {}
linear_w8a8, _linear_w8a8_impl, _linear_w8a8 = make_linear(OP, 8, _holder)


def linear_w8a8_ref(x, weight, weight_scale, bias=None, activation=None):
    """Float64 reference (quantisation per the integer contract, exact integer product)."""
    return linear_ref(x, weight, weight_scale, bias, activation, bits=8)


SPEC = register_linear(OP, linear_w8a8, linear_w8a8_ref, _holder)
