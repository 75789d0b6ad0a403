"""RoPE Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).  Interface: see ``ref.py``.

One launch per tensor (q, then k).  A program owns ``tokens_per_prog`` consecutive tokens
(one on a GPU; a few large programs under the interpreter, which pays per program); for
each token it loads the angle row once (r/2 entries, sin negated for the backward) and
rotates all heads as (BLOCK_H, BLOCK_R) tiles: x1/x2 are the two halves (half-split) or
the even/odd features (interleaved).  Features r..D are copied.

Numerics: fp16/bf16 inputs compute in fp32; fp32 inputs compute the rotation in float64
(exact products, one rounding), the portable equivalent of the CPU kernel's compensated
FMA (the interpreter's ``tl.fma`` is not fused): ~1 ulp of |out| even under cancellation.
The op is memory-bound, so the float64 math is hidden behind the loads even on GPUs with
a low float64 rate.  Position ids outside [0, P) are checked by the caller; the kernel
still never reads outside the tables (the angle load is masked).  Offsets are int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rope_kernel(x_ptr, sxb, sxs, sxh, o_ptr, cos_ptr, sin_ptr, scs, sss, pos_ptr, spb, sps,
                 S, T, H, D, P, tokens_per_prog, sign,
                 HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr,
                 INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr, PASS: tl.constexpr, F64: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_R)
    jm = j < HALF
    if INTERLEAVED:
        i1 = 2 * j
        i2 = 2 * j + 1
    else:
        i1 = j
        i2 = j + HALF
    for it in range(0, tokens_per_prog):
        t = pid * tokens_per_prog + it
        if t < T:
            b = t // S
            s = t % S
            if HAS_POS:
                p = tl.load(pos_ptr + b * spb + s * sps).to(tl.int64)
            else:
                p = s
            pj = p + 0 * j  # the position as a block: a scalar & block mask is not a valid
            tm = jm & (pj >= 0) & (pj < P)  # load mask for every triton (3.9's interpreter rejects it)
            c = tl.load(cos_ptr + p * scs + j, mask=tm, other=0.0)
            sn = tl.load(sin_ptr + p * sss + j, mask=tm, other=0.0)
            if F64:
                c = c.to(tl.float64)
                sn = sn.to(tl.float64) * sign
            else:
                c = c.to(tl.float32)
                sn = sn.to(tl.float32) * sign
            c = c[None, :]
            sn = sn[None, :]
            for h0 in range(0, H, BLOCK_H):
                hh = h0 + tl.arange(0, BLOCK_H)
                hm = (hh < H)[:, None]
                m = hm & jm[None, :]
                src = x_ptr + b * sxb + s * sxs + hh.to(tl.int64)[:, None] * sxh
                dst = o_ptr + (t * H + hh.to(tl.int64))[:, None] * D
                x1 = tl.load(src + i1[None, :], mask=m, other=0.0)
                x2 = tl.load(src + i2[None, :], mask=m, other=0.0)
                if F64:
                    x1 = x1.to(tl.float64)
                    x2 = x2.to(tl.float64)
                else:
                    x1 = x1.to(tl.float32)
                    x2 = x2.to(tl.float32)
                o1 = x1 * c - x2 * sn
                o2 = x2 * c + x1 * sn
                tl.store(dst + i1[None, :], o1.to(o_ptr.dtype.element_ty), mask=m)
                tl.store(dst + i2[None, :], o2.to(o_ptr.dtype.element_ty), mask=m)
                if PASS:
                    for f0 in range(2 * HALF, D, BLOCK_P):
                        f = f0 + tl.arange(0, BLOCK_P)
                        fm = hm & (f < D)[None, :]
                        v = tl.load(src + f[None, :], mask=fm, other=0.0)
                        tl.store(dst + f[None, :], v, mask=fm)


def _launch(x, out, cos, sin, pos, interleaved, r, sign):
    B, S, H, D = x.shape
    T = B * S
    if T == 0 or H == 0:
        return
    if interpreted() or x.device.type != "cuda":
        progs = max(1, min(T, 4))  # the interpreter pays per program
    else:
        progs = T
    per = (T + progs - 1) // progs
    progs = (T + per - 1) // per
    has_pos = pos is not None
    pb, ps = (0, 0) if not has_pos else pos.stride()
    _rope_kernel[(progs,)](
        x, x.stride(0), x.stride(1), x.stride(2), out, cos, sin, cos.stride(0), sin.stride(0),
        pos if has_pos else cos, pb, ps, S, T, H, D, cos.shape[0], per, float(sign),
        HALF=r // 2, BLOCK_R=max(next_pow2(r // 2), 2), BLOCK_H=min(next_pow2(H), 16),
        BLOCK_P=min(max(next_pow2(D - r), 16), 256), INTERLEAVED=bool(interleaved), HAS_POS=has_pos,
        PASS=r < D, F64=x.dtype == torch.float32)


def _run(q, k, cos, sin, pos, interleaved, r, sign):
    qo = new_output(q.shape, q.dtype, q.device)
    ko = new_output(k.shape, k.dtype, k.device)
    _launch(q, qo, cos, sin, pos, interleaved, r, sign)
    _launch(k, ko, cos, sin, pos, interleaved, r, sign)
    return qo, ko


def forward(q, k, cos, sin, pos, interleaved, rotary_dim):
    return _run(q, k, cos, sin, pos, interleaved, rotary_dim, 1.0)


def backward(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim):
    return _run(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim, -1.0)
