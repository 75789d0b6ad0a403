"""Attention native CPU launcher (kernels: attention_fwd.c, attention_bwd.c, attn_tiles.c/.h).

Implements the attention kernel-module interface (see ``ref.py`` / ``__init__.py``): packed varlen
(tokens, heads, D) inputs with arbitrary token/head strides and unit last stride, int32 cu_seqlens,
fp32/fp16/bf16 storage, fp32 accumulation.

* forward: tiled online softmax (FlashAttention-2), one OpenMP work item per (sequence, kv head,
  block of FWD_BLOCK_M queries) covering the whole GQA group, K^T/V tiles packed once per key block;
* backward: P recomputed from lse; pass 1 owns dK/dV per (sequence, kv head, key block), pass 2
  owns dQ per query block: no atomics, no (Lq, Lk) buffer;
* tile products: register-blocked 4x64 fp32 micro-kernel (zmm FMAs at the avx512 level, the same
  vector-extension source elsewhere); bf16 score products (Q K^T, dO V^T) with VDPBF16PS where the
  CPU has AVX512_BF16 (runtime check, target attribute: the avx512 flags stay as they are).

The three C files build into one library per ISA level; its cache name carries a hash of the
folder's header (the JIT hashes only the .c sources and ``csrc/*.h``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..._library import contiguous, new_output
from ... import _jit, dispatch
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DIR = Path(__file__).parent
_SRCS = [_DIR / "attn_tiles.c", _DIR / "attention_fwd.c", _DIR / "attention_bwd.c"]
_libs: dict[str, object] = {}
# query rows per forward work item (a multiple of 16; read at call time)
FWD_BLOCK_M = 64
# backward scheme: -1 auto (single pass over (sequence, kv head) items when they keep every thread
# busy, else two passes over key / query blocks), 0 always two passes, 1 single pass where it fits
BWD_MODE = -1


def _lib():
    level = cpu.isa()
    lib = _libs.get(level)
    if lib is None:
        tag = hashlib.sha256((_DIR / "attn_tiles.h").read_bytes()).hexdigest()[:8]
        lib = _libs[level] = _jit.load(f"attention_{tag}", _SRCS, cpu._BASE_FLAGS + cpu._ISA_FLAGS[level]
                                       + ["-I", str(_DIR), "-lm"], level)
    return lib


def _threads(Tq, Tk, Hq, D):
    return cpu.threads_for(max(Tq, Tk) * Hq * D * 8)


def _vendor_shape(op, q, k, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap):
    """SDPA's (B, Lq, Lk, causal) when the auto rule (or TESSERA_DISPATCH=vendor) sends this call
    to it, else None; a call SDPA cannot express (varlen, window, softcap) always runs the kernel."""
    if q.dtype != torch.bfloat16 or (q.shape[0] < dispatch.MIN_M and dispatch.mode() == "auto"):
        return None    # (fp32 / fp16 not measured against SDPA; decode never goes to the vendor)
    shape = dispatch.attention_shape(q, k, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap)
    if shape is None or not dispatch.use_vendor(op, q.dtype, shape[1], q.shape[1], q.shape[2]):
        return None
    return shape


def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, exact_lse=True):
    Tq, Hq, D = q.shape
    Tk, Hk = k.shape[0], k.shape[1]
    if not exact_lse:   # SDPA's lse serves the backward, not the fp32 rule of a returned one
        shape = _vendor_shape("attention", q, k, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap)
        if shape is not None:
            return dispatch.attention(q, k, v, shape, scale)
    out = new_output((Tq, Hq, D), q.dtype, q.device)
    lse = new_output((Hq, Tq), torch.float32, q.device)
    B = cu_q.shape[0] - 1
    if Tq == 0 or Hq == 0 or B == 0:
        return out, lse
    f = cpu.declare(_lib(), "tsr_attn_fwd", "pllpllpllppllllfllfppili")
    rc = f(cpu.ptr(q), q.stride(0), q.stride(1), cpu.ptr(k), k.stride(0), k.stride(1), cpu.ptr(v), v.stride(0),
           v.stride(1), cpu.ptr(cu_q), cpu.ptr(cu_k), B, Hq, Hk, D, scale, window_left, window_right, softcap,
           cpu.ptr(out), cpu.ptr(lse), cpu.DTYPE_CODE[q.dtype], FWD_BLOCK_M, _threads(Tq, Tk, Hq, D))
    cpu.check_rc(rc, "attention forward")
    return out, lse


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap):
    Tq, Hq, D = q.shape
    Tk, Hk = k.shape[0], k.shape[1]
    shape = _vendor_shape("attention_bwd", q, k, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap)
    if shape is not None:
        return dispatch.attention_backward(dout, q, k, v, out, lse, shape, scale)
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dv = new_output(v.shape, v.dtype, v.device)
    B = cu_q.shape[0] - 1
    if B == 0 or Hq == 0 or (Tq == 0 and Tk == 0):
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:
        dout = contiguous(dout)
    f = cpu.declare(_lib(), "tsr_attn_bwd", "pllpllpllpllpllpppllllfllfpppiii")
    rc = f(cpu.ptr(dout), dout.stride(0), dout.stride(1), cpu.ptr(q), q.stride(0), q.stride(1), cpu.ptr(k),
           k.stride(0), k.stride(1), cpu.ptr(v), v.stride(0), v.stride(1), cpu.ptr(out), out.stride(0),
           out.stride(1), cpu.ptr(lse), cpu.ptr(cu_q), cpu.ptr(cu_k), B, Hq, Hk, D, scale, window_left,
           window_right, softcap, cpu.ptr(dq), cpu.ptr(dk), cpu.ptr(dv), cpu.DTYPE_CODE[q.dtype],
           BWD_MODE, _threads(Tq, Tk, Hq, D))
    cpu.check_rc(rc, "attention backward")
    return dq, dk, dv
