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

from .. import _qlinear_int4 as Q
from .._qlinear_int4.ref import w4a16_eager, w4a16_ref

OP = "linear_w4a16"
_holder: dict = {}
linear_w4a16, _linear_w4a16_impl, _linear_w4a16 = Q.make_op(
    OP, "``act(x @ ((q - z) * s).T + bias)`` with packed int4 weights (see the module docstring).", _holder)

# fp32 accumulation over K products x * (q - z) * s, as two-level sums (per group or per
# 256-k slab, then across them): the error of such a sum grows ~ sqrt(K) * eps32 * sum|x w|;
# with K <= 4096 in the cases and |x|,|w| ~ 1 (sum |x w| ~ 0.8 K), 4 * sqrt(K) * 6e-8 * 0.8 K
# ~ 8e-5 (measured: <= 9e-5 at K = 4096) -- atol 2e-4, rtol 1e-5.
FP32_TOL = {0: (1e-5, 2e-4)}
SPEC = Q.register(OP, linear_w4a16, w4a16_ref, w4a16_eager, _holder, FP32_TOL, a8=False)
