"""Shared code of the int8 matmuls (``int_mm``, ``linear_w8a8``, ``linear_a16w8``).

Formulas (issue #4, ``/work/briefs/quant_interface.md``):

    int_mm(a, b)  = a @ b.T, exact: a int8 [M, K] -> int32 [M, N]; a int16 -> int64
    linear_w8a8   : qx, sx = contract.quantize_rows(x, int8)   (per token, fused in the kernel)
                    acc    = qx @ weight.T                       (exact int32)
                    y      = act(fp32(acc) * (sx * sw) + bias)   (fp32 epilogue, in this order)
    linear_a16w8  : the same with int16 activations (QMAX 32767), int64 accumulators

``weight`` int8 [N, K] (nn.Linear layout), ``weight_scale`` fp32 [N] (per channel) or []
(per tensor), ``bias`` fp32 or x.dtype [N], ``activation`` one of None, "relu", "gelu" (erf),
"gelu_tanh", "silu".  x is fp32/fp16/bf16 [..., K] with any leading dims; y is [..., N] in
x.dtype.  K <= 131071 keeps every int8 x int8 sum inside int32: the largest sum is
K * (-128) * (-128) = K * 2^14, and 131072 * 2^14 = 2^31 wraps (int16 a: see MAX_K).
The integer parts are bit-exact on every backend and ISA level; only the fp32 epilogue
carries rounding.  These are inference ops: they have no gradient (x.requires_grad is fine,
backward through them raises).

This module holds the checks, the custom-op factory for the two linears, the test/bench
cases and the roofline; ``ref.py`` the float64 references; ``cpu.py`` + ``qlinear_int8.c``
the native kernels (``qlinear_epilogue.h``: the epilogue, reusable by other quantised
linears); ``triton.py`` the Triton kernels; ``opencl.py`` + ``qlinear_int8.cl`` the OpenCL kernels
(a local-memory tiled GEMM / GEMV for GPUs, dot-product kernels for CPU devices).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import as_fp32_param, contiguous, direct, rows
from ..._registry import Case
from ...quant import contract
from .ref import ACTIVATIONS

# The K bound of every int8 matmul, enforced by check_k: the largest |int8 x int8| sum is
# K * 128 * 128 = K * 2^14 (every term (-128) * (-128)), which fits int32 (<= 2^31 - 1) for
# K <= 131071; K = 131072 gives exactly 2^31 and wraps to -2^31.  The same bound covers int16 a:
# the CPU kernels flush int32 lanes into int64 every 4096 K, and the Triton kernel splits a into
# two int8 halves whose int32 sums are int8 x int8 sums again (exact only under this bound), so
# the int64 result is exact for every allowed K.  The linears quantise x to |q| <= QMAX (127),
# tighter still (127 * 128 * K < 2^31).
MAX_K = 131071


def check_k(op: str, name: str, t: Tensor) -> None:
    K = t.shape[-1]
    if K < 1 or K > MAX_K:
        raise ValueError(f"tessera.{op}: argument '{name}' ({_checks.describe(t)}) must have a last "
                         f"dimension K in 1..{MAX_K} (K * 128 * 128 must fit the int32 accumulators)")


def check_int_mm(op: str, a, b) -> None:
    _checks.tensor(op, "a", a, dtypes=(torch.int8, torch.int16), min_dim=2)
    _checks.tensor(op, "b", b, dtypes=(torch.int8,), min_dim=2)
    if a.dim() != 2:
        raise ValueError(f"tessera.{op}: argument 'a' ({_checks.describe(a)}) must be 2-D [M, K]")
    if b.dim() != 2 or b.shape[1] != a.shape[1]:
        raise ValueError(f"tessera.{op}: argument 'b' ({_checks.describe(b)}) must be 2-D [N, K] with "
                         f"K = {a.shape[1]} (a.shape[1])")
    check_k(op, "a", a)
    _checks.same_device(op, "a", a, b=b)


def check_linear(op: str, x, weight, weight_scale, bias, activation) -> None:
    _checks.tensor(op, "x", x)
    check_k(op, "x", x)
    K = x.shape[-1]
    _checks.tensor(op, "weight", weight, dtypes=(torch.int8,), min_dim=2)
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"tessera.{op}: argument 'weight' ({_checks.describe(weight)}) must be int8 "
                         f"[N, K] with K = {K} (x.shape[-1])")
    N = weight.shape[0]
    _checks.tensor(op, "weight_scale", weight_scale, dtypes=(torch.float32,), min_dim=0)
    if tuple(weight_scale.shape) not in ((), (N,)):
        raise ValueError(f"tessera.{op}: argument 'weight_scale' ({_checks.describe(weight_scale)}) must "
                         f"have shape [{N}] (per channel) or [] (per tensor)")
    if bias is not None:
        dts = (torch.float32,) if x.dtype == torch.float32 else (torch.float32, x.dtype)
        _checks.tensor(op, "bias", bias, dtypes=dts)
        if tuple(bias.shape) != (N,):
            raise ValueError(f"tessera.{op}: argument 'bias' ({_checks.describe(bias)}) must have shape [{N}]")
    _checks.same_device(op, "x", x, weight=weight, weight_scale=weight_scale, bias=bias)
    if activation not in ACTIVATIONS:
        raise ValueError(f"tessera.{op}: argument 'activation'={activation!r} is not supported; expected "
                         f"one of {ACTIVATIONS}")


def python_types_linear(op, x, weight, weight_scale, bias, activation):
    _checks.python_types(op, {"x": x, "weight": weight, "weight_scale": weight_scale, "bias": bias})
    if weight is None or weight_scale is None:
        raise TypeError(f"tessera.{op}: arguments 'weight' and 'weight_scale' must be torch.Tensors")
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"tessera.{op}: argument 'activation' must be a str or None, got "
                        f"{type(activation).__name__}")


def make_linear(op: str, bits: int, spec_holder: dict):
    """The public function, impl and ``tessera::<op>`` custom op of one quantised linear."""
    from ..._registry import select

    def impl(x: Tensor, weight: Tensor, weight_scale: Tensor, bias: Optional[Tensor],
             activation: Optional[str], backend: str) -> Tensor:
        check_linear(op, x, weight, weight_scale, bias, activation)
        mod = select(spec_holder["spec"], x.device, x.dtype, backend)
        N = weight.shape[0]
        sw = as_fp32_param(weight_scale.reshape(-1).expand(N))
        y = mod.forward(rows(x), contiguous(weight), sw, as_fp32_param(bias), activation)
        return y.view(*x.shape[:-1], N)

    impl.__name__ = f"_{op}_impl"
    custom = torch.library.custom_op(f"tessera::{op}", mutates_args=())(impl)

    @custom.register_fake
    def _(x, weight, weight_scale, bias, activation, backend):
        check_linear(op, x, weight, weight_scale, bias, activation)
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    def public(x: Tensor, weight: Tensor, weight_scale: Tensor, bias: Optional[Tensor] = None,
               activation: Optional[str] = None, *, backend: Optional[str] = None) -> Tensor:
        python_types_linear(op, x, weight, weight_scale, bias, activation)
        return direct(custom, impl, x, weight, weight_scale, bias)(
            x, weight, weight_scale, bias, activation, _checks.backend_arg(op, backend))

    public.__name__ = public.__qualname__ = op
    public.__doc__ = (f"Quantised linear act(fp32(qx @ weight.T) * (sx * sw) + bias) with x quantised per "
                      f"token to int{bits} (integer contract) inside the kernel; y [..., N] in x.dtype.")
    return public, impl, custom


# ---------------------------------------------------------------- cases

def quant_weight(N, K, gen, device, per_tensor=False):
    """A realistic int8 weight: a random fp32 matrix quantised per channel (or per tensor)."""
    w = torch.randn(N, K, generator=gen, dtype=torch.float64).float() * 0.05
    q, s = contract.quantize_tensor(w, torch.int8) if per_tensor else contract.quantize_rows(w, torch.int8)
    return q.to(device), s.to(device)


def linear_case(name, xshape, N, layout="contig", tags=(), bias=False, activation=None, per_tensor=False,
                bias_f32=False, extreme=None):
    """Case of a quantised linear: x [..., K] in the matrix dtype (``layout`` from testing.cases)."""
    from ... import _cases as C

    def mk(dtype, device, gen):
        K = xshape[-1]
        x = C.make(xshape, dtype, device, gen, layout)
        if extreme is not None:
            x = extreme(x)
        w, s = quant_weight(N, K, gen, device, per_tensor)
        kw = {"x": x, "weight": w, "weight_scale": s, "activation": activation}
        kw["bias"] = None
        if bias:
            b = torch.randn(N, generator=gen, dtype=torch.float64)
            kw["bias"] = b.to(torch.float32 if bias_f32 else dtype).to(device)
        return kw
    return Case(name, mk, frozenset(tags))


def _outliers(x):
    x = x.clone()
    x.view(-1)[::7] *= 1e4
    return x


def _zero_nan_inf(x):
    x = x.clone()
    x[0] = 0            # an all-zero row: scale 1e-12 / QMAX, q = 0, y = bias
    x[1, ::3] = float("nan")   # NaN quantises to 0
    x[2, 5] = float("inf")     # amax = inf: every q is 0 and y = 0 * inf = NaN (the contract's result)
    return x


def linear_cases():
    out = [linear_case("gemv-1x33-n7", (1, 33), 7),
           linear_case("7x123-n65-bias", (7, 123), 65, bias=True),
           linear_case("3x5x123-n33-bias-f32", (3, 5, 123), 33, bias=True, bias_f32=True),
           linear_case("16x64-n40-pertensor", (16, 64), 40, per_tensor=True),
           linear_case("gemm-70x201-n77", (70, 201), 77),
           linear_case("gemm-130x256-n67-bias-silu", (130, 256), 67, bias=True, activation="silu"),
           linear_case("empty0x64-n9", (0, 64), 9, tags={"empty"}),
           linear_case("rowslice-5x3x123-n17", (5, 3, 123), 17, "rowslice", {"layout"}),
           linear_case("transposed-5x3x123-n17", (5, 3, 123), 17, "transposed", {"layout"}),
           linear_case("offset-20x77-n30", (20, 77), 30, "offset", {"layout"}),
           linear_case("outliers-9x300-n50", (9, 300), 50, tags={"extreme"}, bias=True, extreme=_outliers),
           linear_case("zero-nan-inf-rows-4x40-n24", (4, 40), 24, tags={"extreme"}, extreme=_zero_nan_inf),
           linear_case("large-3x4099-n300-bias-gelu", (3, 4099), 300, tags={"large"}, bias=True,
                       activation="gelu"),
           linear_case("large-gemm-96x1030-n200", (96, 1030), 200, tags={"large"})]
    for act in ACTIVATIONS[1:]:
        out.append(linear_case(f"act-{act}-6x50-n20-bias", (6, 50), 20, bias=True, activation=act))
        out.append(linear_case(f"act-{act}-gemm-40x72-n33", (40, 72), 33, activation=act))
    return out


BENCH_SHAPES = [(1, 4096, 4096), (1, 4096, 11008), (16, 4096, 4096), (128, 4096, 4096), (512, 4096, 4096)]


def linear_bench_cases():
    return [linear_case(f"M{m}-K{k}-N{n}", (m, k), n) for m, k, n in BENCH_SHAPES]


def _mkn(kw):
    x, w = kw["x"], kw["weight"]
    K = x.shape[-1]
    return x.numel() // max(K, 1), K, w.shape[0]


def linear_bytes_fwd(kw):
    """DRAM bytes of a call: the int8 weight (dominant at decode), its scales, x and y."""
    M, K, N = _mkn(kw)
    x = kw["x"]
    return N * K + kw["weight_scale"].numel() * 4 + (M * K + M * N) * x.element_size()


def linear_flops_fwd(kw):
    M, K, N = _mkn(kw)
    return 2 * M * N * K


def linear_bound(kw):
    """Decode (M < 64) streams the weight: read-bound; prefill (M >= 64) is compute-bound."""
    return "compute" if _mkn(kw)[0] >= 64 else "read"


# fp32 tolerance of the linears' outputs (written reason): the integer accumulators are exact
# (no K-dependent error at all); the fp32 epilogue rounds acc (|acc| > 2^24 possible), sx * sw,
# the product and the bias sum (<= 4 ulp relative to |acc * s| + |bias|) and the activations
# use tsr_expf (< 2 ulp) / A&S erfc (|err| <= 1.5e-7 absolute in Phi): rtol 4e-6 (~32 ulp)
# covers those with room, atol stays the fp32 default.
FP32_TOL = {0: (4e-6, 1e-5)}


def register_linear(op: str, fn, ref, spec_holder: dict):
    """Register the OpSpec of one int8-weight linear (``linear_w8a8`` / ``linear_a16w8``): both
    share cases, bytes/FLOPs model, bound, tolerance and peers; only name, fn and ref differ."""
    from ...quant import peers
    from ..._registry import OpSpec, register_op
    from .ref import EAGER
    spec_holder["spec"] = register_op(OpSpec(
        name=op, fn=fn, ref=ref, eager=EAGER[op],  # activations quantised like the kernel
        kernels={"reference": f"tessera.ops.{op}.ref", "cpu": f"tessera.ops.{op}.cpu",
                 "triton": f"tessera.ops.{op}.triton", "opencl": f"tessera.ops.{op}.opencl",
                 "cpu:aarch64": f"tessera.ops.{op}.cross", "cpu:riscv64": f"tessera.ops.{op}.cross"},
        cases=linear_cases(), grad_inputs=(),
        bytes_fwd=linear_bytes_fwd, flops_fwd=linear_flops_fwd, bound=linear_bound,
        compute_dtype="int8",  # integer dot products (VPDPBUSD): judged against the int8 peak
        bench_cases=linear_bench_cases(), fp32_tol=FP32_TOL, fuzz="test_qlinear_int8.py",
        # weight-only int8 (aten._weight_int8pack_mm), and the weight dequantized once + F.linear
        peers={"torch-int8pack": peers.torch_int8pack, "dequant+matmul": peers.dequant_matmul_int8},
        scalar_ok=("weight_scale",),  # [] = a per-tensor scale
    ))
    return spec_holder["spec"]
