"""linear_fp8 Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

Two launches inside the op:

1. ``_quant_x``: one program per (token, K block) -- the whole row for per-tensor/per-row
   weights, 128 wide for block weights -- computes the contract's scale (``div_rn``, true
   IEEE division) and writes e4m3 codes as uint8 with ``fp8_e4m3_bits`` (integer ops: the
   interpreter cannot cast to fp8).
2. ``_gemm``: BLOCK_M x BLOCK_N output tiles; fp8 codes are loaded as uint8 views.  How the
   exact products are formed depends on the device (all three are exact, accumulation fp32):
   * GPU with fp8 tensor cores (sm_89+) and an e4m3 weight: the codes are bitcast to
     ``float8e4nv`` and multiplied by ``tl.dot`` natively;
   * other GPUs / e5m2 weights: codes decoded to fp32 (``fp8_bits_to_f32``) and narrowed to
     bf16, which is exact for both fp8 formats, then a bf16 ``tl.dot``;
   * interpreter: decoded to fp32 and an ``input_precision="ieee"`` fp32 dot (the
     interpreter's bf16 dot multiplies raw bit patterns).
   Block-scaled weights take BLOCK_K = 128 and fold each K block's partial tile with
   sx_b * sw_b; the epilogue then adds the bias and applies the activation in fp32.

Verified here under the interpreter only (fp32 decode path); the native-fp8 and bf16 dot
paths are selected by device capability and need a GPU run to verify.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import _env
from ..._library import new_output
from ...backends.triton import interpreted, next_pow2
from ...backends.triton_lang import fp8_bits_to_f32, fp8_e4m3_bits, round_bf16, epilogue_act as _act
from .cpu import ACT_CODE
from .ref import BLOCK, scale_kind

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _quant_x(x_ptr, ldx, q_ptr, s_ptr, K, KB, SEG, BLOCK_K: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    k0 = b * SEG
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k in range(0, SEG, BLOCK_K):
        offs = k0 + k + tl.arange(0, BLOCK_K)
        msk = (offs < K) & (offs < k0 + SEG)
        v = tl.load(x_ptr + m * ldx + offs, mask=msk, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.where(v != v, 0.0, tl.abs(v)))
    a = tl.max(amax, axis=0)
    scale = tl.math.div_rn(tl.maximum(a, 1e-12), 448.0)
    tl.store(s_ptr + m * KB + b, scale)
    for k in range(0, SEG, BLOCK_K):
        offs = k0 + k + tl.arange(0, BLOCK_K)
        msk = (offs < K) & (offs < k0 + SEG)
        v = tl.load(x_ptr + m * ldx + offs, mask=msk, other=0.0).to(tl.float32)
        q = tl.math.div_rn(v, tl.full([BLOCK_K], 1.0, tl.float32) * scale)
        q = tl.where(q != q, 0.0, q)
        q = tl.minimum(tl.maximum(q, -448.0), 448.0)
        tl.store(q_ptr + m * K + offs, fp8_e4m3_bits(q).to(tl.uint8), mask=msk)


@triton.jit
def _operand(codes, E5M2: tl.constexpr, MODE: tl.constexpr):
    """fp8 codes -> a tl.dot operand holding the same values exactly (MODE 2 loads them through
    float8e4nv pointers already: a uint8 -> fp8 bitcast did not compile on Triton 3.6 / sm_90)."""
    if MODE == 2:
        return codes
    v = fp8_bits_to_f32(codes.to(tl.int32), E5M2)
    if MODE == 1:
        v = v.to(tl.bfloat16)
    return v


@triton.jit
def _gemm(q_ptr, sx_ptr, w_ptr, sw_ptr, b_ptr, y_ptr, M, N, K, KB,
          KIND: tl.constexpr, E5M2: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
          MODE: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = (pm * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    mm, mn = rm < M, rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(q_ptr + rm[:, None] * K + kk[None, :], mask=mm[:, None] & (kk[None, :] < K), other=0)
        # the weight tile is loaded K-major ([BLOCK_K, BLOCK_N]) instead of transposed in registers
        w = tl.load(w_ptr + rn[None, :] * K + kk[:, None], mask=mn[None, :] & (kk[:, None] < K), other=0)
        if MODE == 0:
            part = tl.dot(_operand(a, False, MODE), _operand(w, E5M2, MODE), input_precision="ieee")
        else:
            part = tl.dot(_operand(a, False, MODE), _operand(w, E5M2, MODE))
        if KIND == 2:
            b = k0 // BLOCK_K
            sx = tl.load(sx_ptr + rm * KB + b, mask=mm, other=0.0)
            sw = tl.load(sw_ptr + (rn // BLOCK_K) * KB + b, mask=mn, other=0.0)
            acc += part * (sx[:, None] * sw[None, :])
        else:
            acc += part
    if KIND != 2:
        sx = tl.load(sx_ptr + rm, mask=mm, other=0.0)
        if KIND == 1:
            sw = tl.load(sw_ptr + rn, mask=mn, other=0.0)
        else:
            sw = tl.load(sw_ptr + rn * 0)
        acc = acc * (sx[:, None] * sw[None, :])
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=mn, other=0.0).to(tl.float32)[None, :]
    acc = round_bf16(_act(acc, ACT), RNE_BF16)  # the interpreter's fp32 -> bf16 cast truncates
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])


def _mode(weight) -> int:
    """0: fp32 decode (interpreter); 1: bf16 decode + bf16 dot; 2: native e4m3 dot (sm_89+)."""
    if interpreted():
        return 0
    if weight.dtype == torch.float8_e4m3fn and torch.version.hip is None and \
            torch.cuda.get_device_capability(weight.device) >= (8, 9) and _env.get("TESSERA_TRITON_FP8_DOT", "1") != "0":
        return 2
    return 1


def forward(x, weight, weight_scale, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0:
        return y
    kind = {"tensor": 0, "row": 1, "block": 2}[scale_kind(weight_scale)]
    seg = BLOCK if kind == 2 else K
    KB = -(-K // seg)
    q = new_output((M, K), torch.uint8, x.device)       # kernel-written workspaces
    sx = new_output((M, KB), torch.float32, x.device)
    bk = min(next_pow2(seg), 128 if kind == 2 else (4096 if interpreted() else 1024))
    _quant_x[(M, KB)](x, x.stride(0), q, sx, K, KB, seg, BLOCK_K=bk)
    mode = _mode(weight)
    if interpreted():
        bm, bn = min(max(next_pow2(M), 16), 64), min(max(next_pow2(N), 16), 64)
    else:
        bm, bn = (64 if M > 32 else 16), 64
    block_k = BLOCK if kind == 2 else (64 if interpreted() else 128)
    grid = (triton.cdiv(M, bm), triton.cdiv(N, bn))
    qa, wa = (q.view(torch.float8_e4m3fn), weight) if mode == 2 else (q, weight.view(torch.uint8))
    _gemm[grid](qa, sx, wa, weight_scale, bias if bias is not None else y, y, M, N, K, KB,
                KIND=kind, E5M2=weight.dtype == torch.float8_e5m2, HAS_BIAS=bias is not None,
                ACT=ACT_CODE[activation], MODE=mode,
                RNE_BF16=interpreted() and x.dtype == torch.bfloat16, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k)
    return y


def backward(*args):
    raise NotImplementedError("linear_fp8 has no gradient (inference only)")
