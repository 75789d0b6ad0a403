"""FP8 x FP8 linear layer (``tessera.linear_fp8``): ``y = act(x @ dequant(weight).T + bias)``.

Weights: ``weight`` float8_e4m3fn or float8_e5m2 [N, K] (nn.Linear layout) with an fp32
``weight_scale`` of shape [] (per tensor), [N] (per output row) or [ceil(N/128), ceil(K/128)]
(128x128 blocks, DeepSeek-V3).  Activations are quantised dynamically inside the kernels to
e4m3 with the integer contract (``tessera.quant.contract``): one scale per token, or, for
block-scaled weights, one per (token, 128-wide K block) -- DeepSeek-V3's "1x128 activation
tiles x 128x128 weight tiles", so each K block's partial sum carries exactly one activation
and one weight scale.

Numerics: an e4m3 x e4m3 (or e4m3 x e5m2) product has at most 4 x 4 significant bits and
exponents inside fp32's normal range, so every product is exact in fp32 (and in the bf16
operands of AVX512_BF16's VDPBF16PS: both fp8 formats embed exactly in bf16); only the fp32
accumulation rounds.  Epilogue, in fp32, in this order on every backend:

    per-token / per-tensor weights : y = acc * (sx * sw[n]) + bias[n]
    block weights                  : y = sum_b acc_b * (sx_b * sw[n/128, b]) + bias[n]
    y = activation(y)              (None, "relu", "gelu" (erf), "gelu_tanh", "silu")

Kernels: cpu (linear_fp8.c), triton, opencl (linear_fp8.cl: x quantised into an e4m3 workspace,
then per-work-item float8 dot products).  Inference only (no gradient).  Sources: DeepSeek-V3 technical report (sec. 3.3, fine-grained
fp8 quantisation); OCP 8-bit floating point spec (e4m3fn / e5m2); torchao float8 rowwise.

Roofline: the fp8 weight (1 byte/element) dominates at decode (memory-bound, M < 64);
prefill (M >= 64) is compute-bound at 2*M*N*K flops.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct, rows
from ..._registry import OpSpec, register_op, select
from .cases import bench_cases, cases
from .ref import ACTIVATIONS, BLOCK, WEIGHT_DTYPES, linear_fp8_eager, linear_fp8_ref

OP = "linear_fp8"


def _check(x, weight, weight_scale, bias, activation):
    _checks.tensor(OP, "x", x)
    _checks.tensor(OP, "weight", weight, dtypes=WEIGHT_DTYPES)
    _checks.tensor(OP, "weight_scale", weight_scale, dtypes=(torch.float32,), min_dim=0)
    K = x.shape[-1]
    if K == 0:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must have a non-empty last dimension")
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must be 2-D [N, K] with "
                         f"K = {K} (the last dimension of 'x' {tuple(x.shape)})")
    N = weight.shape[0]
    ok = [(), (N,), (-(-N // BLOCK), -(-K // BLOCK))]  # a list: symbolic sizes are not hashable
    if not any(tuple(weight_scale.shape) == o for o in ok):
        raise ValueError(f"tessera.{OP}: argument 'weight_scale' ({_checks.describe(weight_scale)}) must have "
                         f"shape () (per tensor), ({N},) (per row) or {(-(-N // BLOCK), -(-K // BLOCK))} "
                         f"(128x128 blocks of 'weight' {tuple(weight.shape)})")
    if bias is not None:
        _checks.tensor(OP, "bias", bias)
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"tessera.{OP}: argument 'bias' ({_checks.describe(bias)}) must be 1-D of size {N} "
                             f"(the rows of 'weight' {tuple(weight.shape)})")
    _checks.choice(OP, "activation", activation, ACTIVATIONS)
    _checks.same_device(OP, "x", x, weight=weight, weight_scale=weight_scale, bias=bias)


def _linear_fp8_impl(x: Tensor, weight_bits: Tensor, e5m2: bool, weight_scale: Tensor, bias: Optional[Tensor],
                     activation: Optional[str], backend: str) -> Tensor:
    # the custom op takes the fp8 weight as its uint8 bit pattern: torch.library.opcheck (and
    # other dispatch modes comparing tensors) cannot handle fp8 arguments on CPU
    weight = weight_bits.view(WEIGHT_DTYPES[int(e5m2)])
    _check(x, weight, weight_scale, bias, activation)
    mod = select(SPEC, x.device, x.dtype, backend)
    y = mod.forward(rows(x), contiguous(weight), contiguous(weight_scale), contiguous(bias), activation)
    return y.view(*x.shape[:-1], weight.shape[0])


_linear_fp8 = torch.library.custom_op("tessera::linear_fp8", mutates_args=())(_linear_fp8_impl)


@_linear_fp8.register_fake
def _(x, weight_bits, e5m2, weight_scale, bias, activation, backend):
    _check(x, weight_bits.view(WEIGHT_DTYPES[int(e5m2)]), weight_scale, bias, activation)
    return x.new_empty((*x.shape[:-1], weight_bits.shape[0]))


def linear_fp8(x: Tensor, weight: Tensor, weight_scale: Tensor, bias: Optional[Tensor] = None,
               activation: Optional[str] = None, *, backend: Optional[str] = None) -> Tensor:
    """``act(x @ (weight * weight_scale).T + bias)`` with x quantised to e4m3 per token (or per
    token and 128-wide K block for 128x128 block-scaled weights); output in x's dtype.
    See the module docstring for layouts and the epilogue order."""
    _checks.python_types(OP, {"x": x, "weight": weight, "weight_scale": weight_scale, "bias": bias})
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"tessera.{OP}: argument 'activation' must be a str or None, got {type(activation).__name__}")
    _checks.tensor(OP, "weight", weight, dtypes=WEIGHT_DTYPES)
    bits = weight.view(torch.uint8)
    return direct(_linear_fp8, _linear_fp8_impl, x, bits, weight_scale, bias)(
        x, bits, weight.dtype == torch.float8_e5m2, weight_scale, bias, activation, _checks.backend_arg(OP, backend))


# ---------------------------------------------------------------- spec: roofline

def _bytes_fwd(kw):
    x, w, s = kw["x"], kw["weight"], kw["weight_scale"]
    M = x.numel() // x.shape[-1]
    b = w.numel() + 4 * s.numel() + x.numel() * x.element_size() + M * w.shape[0] * x.element_size()
    return b + (0 if kw.get("bias") is None else kw["bias"].numel() * kw["bias"].element_size())


def _flops_fwd(kw):
    x, w = kw["x"], kw["weight"]
    return 2 * (x.numel() // x.shape[-1]) * w.shape[0] * w.shape[1]


def _bound(kw):
    """Decode (M < 64) streams the weight: read-bound; prefill is compute-bound."""
    x = kw["x"]
    return "compute" if x.numel() // x.shape[-1] >= 64 else "read"


from ...quant import peers  # noqa: E402  (bench peers; imported here, after the op is defined)

SPEC = register_op(OpSpec(
    name=OP, fn=linear_fp8, ref=linear_fp8_ref, eager=linear_fp8_eager,
    kernels={"reference": "tessera.ops.linear_fp8.ref", "cpu": "tessera.ops.linear_fp8.cpu",
             "triton": "tessera.ops.linear_fp8.triton", "opencl": "tessera.ops.linear_fp8.opencl",
             "cpu:aarch64": "tessera.ops.linear_fp8.cross", "cpu:riscv64": "tessera.ops.linear_fp8.cross"},
    cases=cases(), grad_inputs=(),
    bytes_fwd=_bytes_fwd, flops_fwd=_flops_fwd, bound=_bound, bench_cases=bench_cases(),
    compute_dtype="bf16",  # fp8 x fp8 products are exact in bf16: VDPBF16PS where present
    fuzz="test_linear_fp8.py", scalar_ok=("weight_scale",),
    peers={"dequant+matmul": peers.dequant_matmul_fp8},  # the weight dequantized once, then F.linear  # a 0-d weight_scale is the per-tensor format
    # fp32: the products are exact; only the fp32 sum of K products rounds.  Case data are
    # N(0, 1) (y ~ sqrt(K) <= 64 at K = 4096); the measured worst error is 4.7e-5 at K = 4096
    # (fp32 fma path; 3.0e-5 with VDPBF16PS; <= 7e-6 at K <= 300): atol 1.5e-4 (~3x margin)
    # and rtol 1e-5 for the large outputs.  The default atol 1e-5 is an elementwise-op bound.
    fp32_tol={0: (1e-5, 1.5e-4)},
))
