"""Int4-weight x int8-activation linear (``tessera.linear_w4a8``): dynamic per-token int8 x.

    (qx, sx) = quantize_rows(x, int8)                      per token, tessera.quant.contract rules
    acc_g    = sum_{k in g} qx[k] * (q[k] - z_g)           int32, exact (|acc_g| <= 128*127*15)
    y        = act(sx * sum_g fp32(acc_g) * s_g + bias)    fp32 epilogue, output in x.dtype

``weight`` uint8 [N, K/2] (two int4 codes per byte along K, low nibble = even k),
``weight_scale`` fp32 [N, K/group_size], ``weight_zero`` uint8 [N, K/group_size] or None
(symmetric, zero = 8), ``group_size`` in {32, 64, 128}; x float [..., K] (fp32/fp16/bf16, any
leading dims), ``bias`` [N] or None, ``activation`` None/"relu"/"gelu"/"gelu_tanh"/"silu"
applied in fp32 after the bias.  The activation quantisation is fused in the kernels.
The integer parts are exact on every backend; the fp32 sum over groups is the float epilogue:
the reference, portable C and Triton convert each group's total acc_g, the AVX-512 kernel
converts exact per-lane pieces of acc_g (16 lanes, each within one group) and sums them in fp32
with one horizontal reduction per output (so no per-group shuffles at decode).
Kernels and numerics: ``ops/_qlinear_int4``.

Forward only: no gradients (quantising x has no useful derivative; the weight is frozen).
"""
from __future__ import annotations

from .. import _qlinear_int4 as Q
from .._qlinear_int4.ref import w4a8_eager, w4a8_ref

OP = "linear_w4a8"
_holder: dict = {}
linear_w4a8, _linear_w4a8_impl, _linear_w4a8 = Q.make_op(
    OP, "``act(sx * sum_g fp32(acc_g) * s_g + bias)``: int4 weights, per-token int8 x (module docstring).", _holder)

# the integer accumulators are exact; only the fp32 epilogue rounds.  Portable C: K/g <= 128
# terms fp32(acc_g) * s_g summed in fp32; AVX-512: each acc_g split into exact per-lane
# integer pieces (16 lanes per 128 k), each lane summing its K/128 scaled pieces by FMA, then
# one 16-lane tree: (K/128 + 4) roundings per output.  Either way the error is <= ~(K/g + 4)
# * eps32 * sum|terms| (sum|terms| <= sum_k |qx_k (q_k - z)| s_g) plus one multiply by sx --
# a few 1e-6 relative; atol 2e-5, rtol 1e-5.
FP32_TOL = {0: (1e-5, 2e-5)}
SPEC = Q.register(OP, linear_w4a8, w4a8_ref, w4a8_eager, _holder, FP32_TOL, a8=True)
