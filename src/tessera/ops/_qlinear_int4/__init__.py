"""Shared code of the int4-weight linears ``linear_w4a16`` and ``linear_w4a8`` (issue #4).

Weight layout (``quant_interface``, fixed for every backend):

* ``weight``       uint8 [N, K/2], byte j of row n = code[n, 2j] | code[n, 2j+1] << 4
                   (low nibble = even k; codes are offset binary 0..15);
* ``weight_scale`` fp32 [N, K/group];
* ``weight_zero``  uint8 [N, K/group] (codes 0..15) or None (symmetric: zero = 8);
* ``group_size``   32, 64 or 128, dividing K.

Dequantisation is ``(q - zero) * scale`` (``tessera.quant.contract``).  The float epilogue,
in fp32 and in this order on every backend: ``y = act(acc + bias)`` where ``acc`` is the
op's fp32 result (W4A16: ``x @ W.T``; W4A8: ``sx * sum_g fp32(acc_g) * s_g``) and ``act`` is
one of None, "relu", "gelu" (erf), "gelu_tanh", "silu".

This module holds the argument checks, the packing helper used by the cases, the spec's cases
and roofline; ``ref.py`` the float64 references; ``cpu.py`` + ``qlinear_int4.c``, ``triton.py``
and ``opencl.py`` + ``qlinear_int4.cl`` the kernels of both ops (the op folders' kernel modules
are thin views of them).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._registry import Case
from ...quant import contract
from ...quant.contract import pack_int4, unpack_int4  # noqa: F401  (re-exported for ref/tests)
from ... import _cases as C

from .._qlinear_int8.ref import ACT_CODE, ACTIVATIONS  # noqa: F401  (the epilogue activations shared by the linears)
GROUPS = (32, 64, 128)


# ---------------------------------------------------------------- checks

def check(op, x, weight, weight_scale, weight_zero, group_size, bias, activation):
    """Validate the arguments of an int4 linear; every message names the argument."""
    _checks.tensor(op, "x", x)
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.uint8:
        raise TypeError(f"tessera.{op}: argument 'weight' ({_checks.describe(weight)}) must be a uint8 "
                        "tensor [N, K/2] of packed int4 codes (low nibble = even k)")
    if weight.dim() != 2:
        raise ValueError(f"tessera.{op}: argument 'weight' ({_checks.describe(weight)}) must be 2-D [N, K/2]")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, torch.SymInt)) or group_size not in GROUPS:
        raise ValueError(f"tessera.{op}: argument 'group_size'={group_size!r} is not supported; "
                         f"expected one of {GROUPS}")
    K = x.shape[-1]
    if K % 2:
        raise ValueError(f"tessera.{op}: argument 'x' ({_checks.describe(x)}) has an odd last dimension "
                         f"K={K}; int4 weights pack two values per byte along K, so K must be even")
    if weight.shape[1] * 2 != K:
        raise ValueError(f"tessera.{op}: argument 'weight' ({_checks.describe(weight)}) must be [N, K/2] = "
                         f"[N, {K // 2}] for x of last dimension K={K}")
    if K % group_size:
        raise ValueError(f"tessera.{op}: argument 'group_size'={group_size} does not divide K={K} "
                         f"(the last dimension of 'x' {tuple(x.shape)})")
    N, G = weight.shape[0], K // group_size
    _checks.tensor(op, "weight_scale", weight_scale, dtypes=(torch.float32,))
    if tuple(weight_scale.shape) != (N, G):
        raise ValueError(f"tessera.{op}: argument 'weight_scale' ({_checks.describe(weight_scale)}) must be "
                         f"fp32 [N, K/group_size] = [{N}, {G}]")
    if weight_zero is not None:
        if not isinstance(weight_zero, torch.Tensor) or weight_zero.dtype != torch.uint8:
            raise TypeError(f"tessera.{op}: argument 'weight_zero' ({_checks.describe(weight_zero)}) must be "
                            "a uint8 tensor of zero-point codes 0..15, or None")
        if tuple(weight_zero.shape) != (N, G):
            raise ValueError(f"tessera.{op}: argument 'weight_zero' ({_checks.describe(weight_zero)}) must be "
                             f"[N, K/group_size] = [{N}, {G}]")
    if bias is not None:
        _checks.tensor(op, "bias", bias)
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"tessera.{op}: argument 'bias' ({_checks.describe(bias)}) must be 1-D of size "
                             f"N={N} (the rows of 'weight')")
    _checks.choice(op, "activation", activation, ACTIVATIONS)
    _checks.same_device(op, "x", x, weight=weight, weight_scale=weight_scale, weight_zero=weight_zero, bias=bias)


def python_types(op, x, weight, weight_scale, weight_zero, bias, activation, group_size):
    if isinstance(group_size, bool) or not isinstance(group_size, (int, torch.SymInt)):
        raise TypeError(f"tessera.{op}: argument 'group_size' must be an int (32, 64 or 128), "
                        f"got {type(group_size).__name__}")
    for name, t in (("x", x), ("weight", weight), ("weight_scale", weight_scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tessera.{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("weight_zero", weight_zero), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"tessera.{op}: argument '{name}' must be a torch.Tensor or None, "
                            f"got {type(t).__name__}")
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"tessera.{op}: argument 'activation' must be a str or None, got {type(activation).__name__}")


# ---------------------------------------------------------------- packing (cases, tests)

def quantize_weight(w: torch.Tensor, group: int, zero_point: bool):
    """float [N, K] -> (packed uint8 [N, K/2], fp32 scale [N, K/g], zero uint8 [N, K/g] or None)."""
    q, s, z = contract.quantize_groups(w.float(), group, "int4", zero_point)
    return pack_int4(q), s.contiguous(), (None if z is None else z.contiguous())


def dequantize_weight(weight, weight_scale, weight_zero, group_size, dtype=torch.float32):
    """(q - zero) * scale as [N, K] in fp32 (contract.dequantize_values), then cast to dtype."""
    q = unpack_int4(weight).float()
    N, K = q.shape
    z = 8.0 if weight_zero is None else weight_zero.float().repeat_interleave(group_size, 1)
    s = weight_scale.float().repeat_interleave(group_size, 1)
    return ((q - z) * s).to(dtype)


# ---------------------------------------------------------------- cases

def _build(name, xshape, N, group, zp=False, layout="contig", tags=(), bias=False, act=None, fill=None):
    def mk(dtype, device, gen):
        K = xshape[-1]
        x = C.make(xshape, dtype, device, gen, layout)
        if fill is not None:
            x = fill(x)
        w = torch.randn(N, K, generator=gen, dtype=torch.float64)
        weight, scale, zero = quantize_weight(w, group, zp)
        kw = {"x": x, "weight": weight.to(device), "weight_scale": scale.to(device),
              "weight_zero": None if zero is None else zero.to(device), "group_size": group}
        kw["bias"] = C.make((N,), dtype, device, gen) if bias else None
        kw["activation"] = act
        return kw
    return Case(name, mk, frozenset(tags))


def _outliers(x):
    x = x.clone()
    x[..., 3] = 1e4
    x[..., -1] = -1e4
    return x


def _zero_row(x):
    x = x.clone()
    x[1] = 0
    return x


def _nan(x):
    x = x.clone()
    x[0, 5] = float("nan")
    return x


def cases():
    """Shapes respect K % group == 0; odd M and N; GEMV (M <= 16) and GEMM (M >= 64) sizes."""
    return [
        _build("1x32x7-g32", (1, 32), 7, 32),
        _build("7x96x33-g32-zp", (7, 96), 33, 32, zp=True),
        _build("3x5x128x123-g64", (3, 5, 128), 123, 64),
        _build("16x256x19-g128", (16, 256), 19, 128),
        _build("13x192x9-g64-zp", (13, 192), 9, 64, zp=True),
        _build("67x256x17-g128-zp", (67, 256), 17, 128, zp=True),
        _build("130x384x40-g128", (130, 384), 40, 128),
        _build("bias-5x64x11", (5, 64), 11, 32, bias=True),
        _build("relu-5x64x11", (5, 64), 11, 32, bias=True, act="relu"),
        _build("gelu-3x128x21", (3, 128), 21, 64, act="gelu"),
        _build("gelu_tanh-3x128x21-zp", (3, 128), 21, 32, zp=True, bias=True, act="gelu_tanh"),
        _build("gelu_tanh-2x3x64x9-zp", (2, 3, 64), 9, 32, zp=True, bias=True, act="gelu_tanh"),
        _build("silu-70x128x21", (70, 128), 21, 128, act="silu", bias=True),
        _build("rowslice-5x3x128", (5, 3, 128), 13, 32, layout="rowslice", tags={"layout"}),
        _build("transposed-6x64", (6, 64), 9, 64, layout="transposed", tags={"layout"}),
        _build("offset-4x96", (4, 96), 10, 32, zp=True, layout="offset", tags={"layout"}),
        _build("empty-0x64", (0, 64), 8, 32, tags={"empty"}),
        _build("outliers-4x128", (4, 128), 12, 32, fill=_outliers, tags={"extreme"}),
        _build("zero-row-3x64", (3, 64), 7, 64, zp=True, fill=_zero_row, tags={"extreme"}),
        _build("nan-2x64", (2, 64), 5, 32, fill=_nan, tags={"extreme"}),
        _build("large-1x4096x300", (1, 4096), 300, 128, tags={"large"}),
        _build("large-64x4096x64-zp", (64, 4096), 64, 128, zp=True, tags={"large"}),
    ]


def bench_cases():
    """Decode (M = 1, 16) and prefill (M = 128, 512) rows of the issue, group 128, symmetric."""
    def build(name, M, K, N):
        def mk(dtype, device, gen):
            w = torch.randn(N, K, generator=gen)
            weight, scale, _ = quantize_weight(w, 128, False)
            return {"x": torch.randn(M, K, generator=gen).to(dtype).to(device), "weight": weight.to(device),
                    "weight_scale": scale.to(device), "weight_zero": None, "group_size": 128,
                    "bias": None, "activation": None}
        return Case(name, mk, frozenset())
    return [build("M1-4096x4096", 1, 4096, 4096), build("M1-4096x11008", 1, 4096, 11008),
            build("M16-4096x4096", 16, 4096, 4096), build("M128-4096x4096", 128, 4096, 4096),
            build("M512-4096x4096", 512, 4096, 4096)]


# ---------------------------------------------------------------- roofline

def bytes_fwd(kw):
    """Weight bytes + scales (+ zeros) + x + y: the packed weight dominates at decode."""
    x, w = kw["x"], kw["weight"]
    M = x.numel() // max(x.shape[-1], 1)
    n = w.numel() + kw["weight_scale"].numel() * 4
    if kw.get("weight_zero") is not None:
        n += kw["weight_zero"].numel()
    if kw.get("bias") is not None:
        n += kw["bias"].numel() * kw["bias"].element_size()
    return n + x.numel() * x.element_size() + M * w.shape[0] * x.element_size()


def flops_fwd(kw):
    x = kw["x"]
    return 2 * x.numel() * kw["weight"].shape[0]


def bound(kw):
    """GEMV (M <= 16) streams the weight: read-bound; GEMM (M >= 64) is compute-bound."""
    x = kw["x"]
    M = x.numel() // max(x.shape[-1], 1)
    return "compute" if M >= 64 else "read"


def peers(a8: bool = False):
    """Other libraries' int4 CPU kernels timed beside ours (``tessera.quant.peers``): torch's
    int4pack GEMM, ONNX Runtime MatMulNBits with float activations and, for W4A8, MatMulNBits
    with accuracy_level 4 (ORT quantises the activations to int8 itself: the like-for-like peer)."""
    from ...quant import peers as P
    out = {"torch-int4pack": P.torch_int4pack, "ort-matmulnbits": P.ort_matmulnbits,
           "dequant+matmul": P.dequant_matmul_int4}  # the weight dequantized once, then F.linear
    if a8:
        out["ort-matmulnbits-a8"] = P.ort_matmulnbits_a8
    return out


# ---------------------------------------------------------------- the op wrapper and its spec

def make_op(op: str, summary: str, spec_holder: dict):
    """The public function, impl and ``tessera::<op>`` custom op of one int4 linear (both ops
    share signature, checks and launch; ``spec_holder["spec"]`` is filled by ``register``)."""
    from ..._library import direct, rows
    from ..._registry import select

    def impl(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Optional[Tensor], group_size: int,
             bias: Optional[Tensor], activation: Optional[str], backend: str) -> Tensor:
        check(op, x, weight, weight_scale, weight_zero, group_size, bias, activation)
        mod = select(spec_holder["spec"], x.device, x.dtype, backend)
        y = mod.forward(rows(x), weight, weight_scale, weight_zero, group_size, bias, activation)
        return y.view(*x.shape[:-1], weight.shape[0])

    impl.__name__ = f"_{op}_impl"
    custom = torch.library.custom_op(f"tessera::{op}", mutates_args=())(impl)

    @custom.register_fake
    def _(x, weight, weight_scale, weight_zero, group_size, bias, activation, backend):
        check(op, x, weight, weight_scale, weight_zero, group_size, bias, activation)
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    def public(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_zero: Optional[Tensor] = None,
               group_size: int = 128, bias: Optional[Tensor] = None, activation: Optional[str] = None,
               *, backend: Optional[str] = None) -> Tensor:
        python_types(op, x, weight, weight_scale, weight_zero, bias, activation, group_size)
        return direct(custom, impl, x, weight, weight_scale, weight_zero, bias)(
            x, weight, weight_scale, weight_zero, group_size, bias, activation, _checks.backend_arg(op, backend))

    public.__name__ = public.__qualname__ = op
    public.__doc__ = summary
    return public, impl, custom


def register(op: str, fn, ref, eager, spec_holder: dict, fp32_tol: dict, a8: bool):
    """Register the OpSpec of one int4 linear: cases, bytes/FLOPs model, bound and peers are
    shared; name, fn, references, tolerance and the W4A8 peer differ."""
    from ..._registry import OpSpec, bf16_compute_if, register_op
    spec_holder["spec"] = register_op(OpSpec(
        name=op, fn=fn, ref=ref, eager=eager,
        kernels={"reference": f"tessera.ops.{op}.ref", "cpu": f"tessera.ops.{op}.cpu",
                 "triton": f"tessera.ops.{op}.triton", "opencl": f"tessera.ops.{op}.opencl",
                 "cpu:aarch64": f"tessera.ops.{op}.cross", "cpu:riscv64": f"tessera.ops.{op}.cross"},
        cases=cases(), grad_inputs=(), bytes_fwd=bytes_fwd, flops_fwd=flops_fwd, bound=bound,
        # W4A8: VPDPBUSD.  W4A16: the kernel's GEMM runs fp32 FMAs, but bf16 x lets the vendor
        # route (dispatch) run oneDNN's bf16 GEMM (AMX on Sapphire Rapids), so a bf16 row is judged
        # against the bf16 peak -- against the FMA peak it read 235-420 %
        compute_dtype="int8" if a8 else bf16_compute_if("x"),
        bench_cases=bench_cases(), fp32_tol=fp32_tol, fuzz="test_qlinear_int4.py", peers=peers(a8=a8),
    ))
    return spec_holder["spec"]
