"""Quantised linear ``tessera.linear_a16w8(x, weight, weight_scale, bias=None, activation=None)``.

A16W8: int16 per-token activations (QMAX 32767) x int8 weights, int64 accumulation (int32 partials flushed before they can overflow):

    qx, sx = quantize_rows(x, torch.int16)          per token, fused in the kernel (integer contract)
    acc    = qx @ weight.T                        exact integers
    y      = act(fp32(acc) * (sx * sw) + bias)    fp32 epilogue, this order; y in x.dtype

weight int8 [N, K], weight_scale fp32 [N] or [], bias fp32/x.dtype [N] or None, activation
None/"relu"/"gelu"/"gelu_tanh"/"silu".  Formulas, numerics and kernels: ops/_qlinear_int8.
Inference op: no gradient.
"""
from __future__ import annotations

from .._qlinear_int8 import make_linear, register_linear
from .._qlinear_int8.ref import linear_ref

OP = "linear_a16w8"
_holder: dict = {}
linear_a16w8, _linear_a16w8_impl, _linear_a16w8 = make_linear(OP, 16, _holder)


def linear_a16w8_ref(x, weight, weight_scale, bias=None, activation=None):
    """Float64 reference (quantisation per the integer contract, exact integer product)."""
    return linear_ref(x, weight, weight_scale, bias, activation, bits=16)


SPEC = register_linear(OP, linear_a16w8, linear_a16w8_ref, _holder)
