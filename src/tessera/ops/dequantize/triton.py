"""dequantize_blocks Triton kernel (GPU; CPU tensors under TRITON_INTERPRET=1).

Tiles of output values; each reads its code (int8/int16, a nibble of a packed byte, or fp8
bits through a uint8 view decoded with integer ops -- NaN/inf codes included), its block's
scale (and zero point), computes fp32 (q - zero) * scale and rounds once to the output dtype
(bf16 through the integer RNE helper: the interpreter's own cast truncates).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends.triton import interpreted
from ...backends.triton_lang import fp8_bits_to_f32, round_bf16
from ..quantize.triton import tiles
from .cpu import KIND as _KIND
from .ref import launch_plan

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _dequant_kernel(q_ptr, ldq, s_ptr, z_ptr, o_ptr, M, K, br, bc, Kb,
                    KIND: tl.constexpr, HAS_Z: tl.constexpr, RNE_BF16: tl.constexpr,
                    RB: tl.constexpr, CB: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * RB + tl.arange(0, RB).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * CB + tl.arange(0, CB).to(tl.int64)
    m = (rows[:, None] < M) & (cols[None, :] < K)
    sidx = (rows[:, None] // br) * Kb + cols[None, :] // bc
    s = tl.load(s_ptr + sidx, mask=m, other=0.0)
    if KIND == 2:
        byte = tl.load(q_ptr + rows[:, None] * ldq + cols[None, :] // 2, mask=m, other=0).to(tl.int32)
        c = ((byte >> ((cols[None, :] % 2) * 4).to(tl.int32)) & 15).to(tl.float32)
        if HAS_Z:
            z = tl.load(z_ptr + sidx, mask=m, other=0).to(tl.float32)
        else:
            z = 8.0
        v = (c - z) * s
    elif KIND >= 3:
        bits = tl.load(q_ptr + rows[:, None] * ldq + cols[None, :], mask=m, other=0).to(tl.int32)
        mag = bits & 0x7F
        # magnitude through the helper, sign as a bit: negating would turn code 0x80 into +0.0
        if KIND == 5:   # e4m3fnuz: bias 8, the magnitude bits times 2^-119
            f = (mag << 20).to(tl.float32, bitcast=True) * 6.646139978924579e35
        else:
            f = fp8_bits_to_f32(mag, KIND == 4)
        f = (f.to(tl.int32, bitcast=True) | ((bits & 0x80) << 24)).to(tl.float32, bitcast=True)
        if KIND == 3:
            f = tl.where(mag == 0x7F, float("nan"), f)
        elif KIND == 5:
            f = tl.where(bits == 0x80, float("nan"), f)
        else:
            f = tl.where(mag == 0x7C, tl.where((bits & 0x80) != 0, float("-inf"), float("inf")), f)
            f = tl.where(mag > 0x7C, float("nan"), f)
        v = f * s
    else:
        v = tl.load(q_ptr + rows[:, None] * ldq + cols[None, :], mask=m, other=0).to(tl.float32) * s
    v = round_bf16(v, RNE_BF16)
    tl.store(o_ptr + rows[:, None] * K + cols[None, :], v.to(o_ptr.dtype.element_ty), mask=m)


def forward(data, scale, zero, block_rows, block, dtype):
    M, K, (br, bc, Kb), out, q = launch_plan(data, block_rows, block, dtype)
    if M == 0:
        return out
    rb, cb = tiles(M, K)
    _dequant_kernel[(triton.cdiv(M, rb), triton.cdiv(K, cb))](
        q, data.stride(0), scale, scale if zero is None else zero, out, M, K, br, bc, Kb,
        KIND=_KIND[data.dtype], HAS_Z=zero is not None, RNE_BF16=dtype == torch.bfloat16 and interpreted(),
        RB=rb, CB=cb)
    return out


def backward(*args):
    raise NotImplementedError("dequantize_blocks has no gradient")
