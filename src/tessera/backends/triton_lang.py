"""``@triton.jit`` helpers shared by the Triton kernel modules, and the Triton form of the
integer contract's per-row quantisation (``quant_rows_kernel`` / :func:`quantize_rows`, used by
every quantised linear that quantises its activations per token).

Imports triton, so only kernel modules import it (``backends/triton.py`` stays
importable without triton for ``tessera info`` and lean ``import tessera``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .._library import new_output
from .triton import interpreted, next_pow2


@triton.jit
def round_bf16(v, RNE_BF16: tl.constexpr):
    """fp32 values rounded to nearest even at bf16 precision, NaN kept: a following bf16 cast is
    then exact.  Needed under the interpreter, whose fp32 -> bf16 cast truncates."""
    if RNE_BF16:
        u = v.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        v = tl.where(v != v, v, u.to(tl.float32, bitcast=True))
    return v


@triton.jit
def rint(q, HW_RINT: tl.constexpr):
    """Round half to even.  libdevice ``rint`` on GPUs; the interpreter lacks libdevice, so
    there the exact equivalent ``(q + 1.5 * 2^23) - 1.5 * 2^23`` (valid for |q| <= 2^22:
    clamp first)."""
    if HW_RINT:
        return libdevice.rint(q)
    return (q + 12582912.0) - 12582912.0


@triton.jit
def fp8_e4m3_bits(q):
    """fp32 (|q| <= 448, not NaN) -> OCP e4m3fn bit pattern (int32 0..255), round to nearest
    even, subnormals included.  Integer ops only: no fp8 type is needed (the interpreter
    cannot load/store fp8 reliably)."""
    a = tl.abs(q)
    u = a.to(tl.int32, bitcast=True)
    r = u + 0x7FFFF + ((u >> 20) & 1)  # RNE to 3 mantissa bits
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    sub = ((a * 512.0 + 12582912.0) - 12582912.0).to(tl.int32)  # multiples of 2^-9, RNE (8 = min normal)
    code = tl.where(a < 0.015625, sub, normal)
    return code | tl.where(u != q.to(tl.int32, bitcast=True), 0x80, 0)


@triton.jit
def fp8_e5m2_bits(q):
    """fp32 (|q| <= 57344, not NaN) -> OCP e5m2 bit pattern (int32 0..255), RNE, subnormals
    (multiples of 2^-16 below 2^-14) included."""
    a = tl.abs(q)
    u = a.to(tl.int32, bitcast=True)
    r = u + 0xFFFFF + ((u >> 21) & 1)  # RNE to 2 mantissa bits
    normal = (((r >> 23) - 112) << 2) | ((r >> 21) & 3)
    sub = ((a * 65536.0 + 12582912.0) - 12582912.0).to(tl.int32)
    code = tl.where(a < 6.103515625e-05, sub, normal)
    return code | tl.where(u != q.to(tl.int32, bitcast=True), 0x80, 0)


@triton.jit
def fp8_bits_to_f32(b, E5M2: tl.constexpr):
    """e4m3fn / e5m2 bits (int32 0..255) -> fp32, exact for finite codes: the significand as an
    integer times a power of two built from exponent bits, so no intermediate is an fp32
    denormal (a GPU may flush those to zero; the first version placed the code's bits under
    fp32's exponent and multiplied, which lost every fp8 subnormal that way).  NaN/inf codes
    are not produced by tessera's saturating quantisers and are not decoded specially here."""
    mag = b & 0x7F
    if E5M2:
        e = mag >> 2
        sig = tl.where(e == 0, mag & 3, (mag & 3) + 4)
        p = tl.where(e == 0, -16, e - 17)          # value = sig * 2^p (bias 15, 2 mantissa bits)
    else:
        e = mag >> 3
        sig = tl.where(e == 0, mag & 7, (mag & 7) + 8)
        p = tl.where(e == 0, -9, e - 10)           # bias 7, 3 mantissa bits
    v = sig.to(tl.float32) * ((p + 127) << 23).to(tl.float32, bitcast=True)
    # the sign as a bit (``-v`` is ``0 - v`` in Triton, which turns -0.0 into +0.0)
    return (v.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def epilogue_act(v, ACT: tl.constexpr):
    """The quantized linears' fp32 epilogue activation; ACT codes as ``ops/_qlinear_int8/ref.ACT_CODE``:
    0 none, 1 relu, 2 gelu (erf), 3 gelu_tanh (0.5 v (1 + tanh u) written as v * sigmoid(2u)), 4 silu."""
    if ACT == 1:
        v = tl.where(v < 0.0, 0.0, v)
    elif ACT == 2:
        v = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    elif ACT == 3:
        u = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        v = v / (1.0 + tl.exp(-2.0 * u))
    elif ACT == 4:
        v = v / (1.0 + tl.exp(-v))
    return v


@triton.jit
def quant_rows_kernel(x_ptr, sx, q_ptr, s_ptr, K, QMAX: tl.constexpr, BLOCK_K: tl.constexpr,
                      HW_RINT: tl.constexpr):
    """One program per row of x (row stride ``sx``, unit inner stride): the integer contract
    (``tessera.quant.contract.quantize_rows``) bit for bit.  Pass 1: amax over K with NaN as 0;
    scale = max(amax, 1e-12) / QMAX as a correctly rounded fp32 division (``div_rn``).  Pass 2:
    q = div_rn(x, scale) (a true IEEE division, not x * (1 / scale)), NaN -> 0, saturate to
    +-QMAX, round half to even (``rint``, exact for |q| <= 2^22 >= 32767), stored in q's dtype
    (q [M, K] contiguous).  The scale goes to s_ptr[row]."""
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_ptr + row * sx + k, mask=k < K, other=0.0).to(tl.float32)
        a = tl.abs(v)
        amax = tl.maximum(amax, tl.where(a != a, 0.0, a))
    lane = tl.arange(0, BLOCK_K)
    m = tl.max(amax, axis=0) + tl.zeros((BLOCK_K,), dtype=tl.float32)   # the row amax in every lane
    scale = tl.math.div_rn(tl.maximum(m, 1e-12), tl.full((BLOCK_K,), QMAX, tl.float32))
    tl.store(s_ptr + row + lane * 0, scale, mask=lane == 0)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_ptr + row * sx + k, mask=k < K, other=0.0).to(tl.float32)
        q = tl.math.div_rn(v, scale)
        q = tl.where(q != q, 0.0, q)
        q = rint(tl.minimum(tl.maximum(q, -QMAX), QMAX), HW_RINT)
        tl.store(q_ptr + row * K + k, q.to(q_ptr.dtype.element_ty), mask=k < K)


_QMAX = {torch.int8: 127.0, torch.int16: 32767.0}


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] row view (any row stride, unit inner stride) -> (q [M, K] ``dtype`` contiguous,
    fp32 scales [M]) per the integer contract; ``dtype`` int8 (QMAX 127) or int16 (32767)."""
    if dtype not in _QMAX:
        raise ValueError(f"quantize_rows: dtype must be torch.int8 or torch.int16, got {dtype}")
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"quantize_rows: x must be a 2-D row view with unit inner stride, got shape "
                         f"{tuple(x.shape)} strides {tuple(x.stride())}")
    M, K = x.shape
    q = new_output((M, K), dtype, x.device)  # kernel-written workspaces (poisoned under test)
    s = new_output((M,), torch.float32, x.device)
    if M:
        quant_rows_kernel[(M,)](x, x.stride(0), q, s, K, QMAX=_QMAX[dtype],
                                BLOCK_K=min(next_pow2(K), 4096 if interpreted() else 1024),
                                HW_RINT=not interpreted())
    return q, s
