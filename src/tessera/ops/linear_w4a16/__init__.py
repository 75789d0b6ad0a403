"""Int4-weight x float-activation linear (``tessera.linear_w4a16``), GPTQ/AWQ-style W4A16.

    y = act(x @ ((q - z) * s).T + bias)       fp32 accumulation, output in x.dtype

``weight`` uint8 [N, K/2] (two int4 codes per byte along K, low nibble = even k),
``weight_scale`` fp32 [N, K/group_size], ``weight_zero`` uint8 [N, K/group_size] or None
(symmetric, zero = 8), ``group_size`` in {32, 64, 128}; x float [..., K] (fp32/fp16/bf16, any
leading dims), ``bias`` [N] or None, ``activation`` None/"relu"/"gelu"/"gelu_tanh"/"silu"
applied in fp32 after the bias.  Kernels and numerics: ``ops/_qlinear_int4``.

Forward only: no gradients (the weight is frozen and quantised; a backward for x is a
transposed int4 GEMM not provided here).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, rows
from ..._registry import OpSpec, register_op, select
from .. import _qlinear_int4 as Q
from .._qlinear_int4.ref import w4a16_eager, w4a16_ref

OP = "linear_w4a16"


def _linear_w4a16_impl(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Optional[Tensor],
                       group_size: int, bias: Optional[Tensor], activation: Optional[str], backend: str) -> Tensor:
    Q.check(OP, x, weight, weight_scale, weight_zero, group_size, bias, activation)
    mod = select(SPEC, x.device, x.dtype, backend)
    y = mod.forward(rows(x), weight, weight_scale, weight_zero, group_size, bias, activation)
    return y.view(*x.shape[:-1], weight.shape[0])


_linear_w4a16 = torch.library.custom_op("tessera::linear_w4a16", mutates_args=())(_linear_w4a16_impl)


@_linear_w4a16.register_fake
def _(x, weight, weight_scale, weight_zero, group_size, bias, activation, backend):
    Q.check(OP, x, weight, weight_scale, weight_zero, group_size, bias, activation)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_w4a16(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Optional[Tensor] = None,
                 group_size: int = 128, bias: Optional[Tensor] = None, activation: Optional[str] = None,
                 *, backend: Optional[str] = None) -> Tensor:
    """``act(x @ ((q - z) * s).T + bias)`` with packed int4 weights (see the module docstring)."""
    Q.python_types(OP, x, weight, weight_scale, weight_zero, bias, activation, group_size)
    return direct(_linear_w4a16, _linear_w4a16_impl, x, weight, weight_scale, weight_zero, bias)(
        x, weight, weight_scale, weight_zero, group_size, bias, activation, _checks.backend_arg(OP, backend))


SPEC = register_op(OpSpec(
    name=OP, fn=linear_w4a16, ref=w4a16_ref, eager=w4a16_eager,
    kernels={"reference": "tessera.ops.linear_w4a16.ref", "cpu": "tessera.ops.linear_w4a16.cpu",
             "triton": "tessera.ops.linear_w4a16.triton"},
    cases=Q.cases(), grad_inputs=(),
    bytes_fwd=Q.bytes_fwd, flops_fwd=Q.flops_fwd, bound=Q.bound, bench_cases=Q.bench_cases(),
    # fp32 accumulation over K products x * (q - z) * s, as two-level sums (per group or per
    # 256-k slab, then across them): the error of such a sum grows ~ sqrt(K) * eps32 * sum|x w|;
    # with K <= 4096 in the cases and |x|,|w| ~ 1 (sum |x w| ~ 0.8 K), 4 * sqrt(K) * 6e-8 * 0.8 K
    # ~ 8e-5 (measured: <= 9e-5 at K = 4096) -- atol 2e-4, rtol 1e-5.
    fp32_tol={0: (1e-5, 2e-4)},
    fuzz="test_qlinear_int4.py",
    peers=Q.peers(),
))
