"""``@triton.jit`` helpers shared by the Triton kernel modules.

Imports triton, so only kernel modules import it (``backends/triton.py`` stays
importable without triton for ``tessera info`` and lean ``import tessera``).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


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
    """e4m3fn / e5m2 bits (int32 0..255) -> fp32, exact for finite codes (the magnitude bits
    placed under fp32's exponent, then one power-of-two multiply).  NaN/inf codes are not
    produced by tessera's saturating quantisers and are not decoded specially here."""
    mag = b & 0x7F
    if E5M2:
        v = (mag << 21).to(tl.float32, bitcast=True) * 5.192296858534828e33  # 2^112
    else:
        v = (mag << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120
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
