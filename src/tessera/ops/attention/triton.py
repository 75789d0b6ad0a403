"""Attention Triton kernels: FlashAttention-2 style forward (GPU; CPU tensors under TRITON_INTERPRET=1).

Math (``attn_interface.md``), for sequence b with Lq queries, Lk keys, off = Lk - Lq
(bottom-right alignment), local query i and key j:

    allowed(i, j) = (wl < 0 or j >= i + off - wl) and (wr < 0 or j <= i + off + wr)
    s_ij  = scale * <q_i, k_j>;  with softcap c > 0: s_ij = c * tanh(s_ij / c)
    lse_i = log sum_{allowed j} exp(s_ij)        (-inf when no key is allowed)
    out_i = sum_j exp(s_ij - lse_i) v_j          (0 for a row without keys, never NaN)

Forward (Dao, "FlashAttention-2", 2023, Algorithm 1): one program per (query block,
q head, sequence).  The query tile stays in registers; the program walks the key
blocks of [lo, hi), the union of the keys its rows may see (blocks fully masked by
causality or the sliding window are never loaded), keeping the online-softmax
statistics m (running max) and l (running sum, rescaled by exp(m_old - m_new)) and
an fp32 accumulator.  The max used as the shift is 0 while a row has seen only
masked scores, so exp gives 0 and no NaN appears; a row that ends with l = 0 gets
out = 0 and lse = -inf.  GQA/MQA: q head h reads kv head h // (Hq // Hk).
Variable length: cu_seqlens (int32) give each sequence's token range; the grid
covers max_q, so programs past a sequence's end do nothing, and every token of a
zero-length-key sequence still gets out = 0.  The head dim is padded to a power of
two BLOCK_D with masked loads (any D <= 256).  All index arithmetic is int64
(program ids and cu_seqlens are widened first): token offsets may exceed 2^31, and
the interpreter's int32 overflow sanitizer (~1 ms per int32 op) is never entered.

Numerics: scores, softmax statistics and both products accumulate in fp32; fp32
inputs use IEEE fp32 dots (no TF32), so fp32 results meet fp32 tolerances.  The
softcap tanh is libdevice's on a GPU; the interpreter has no libdevice, so there it
is computed as -expm1(-2|x|) / (2 + expm1(-2|x|)) with Kahan's accurate expm1
(exp and log of numpy are correctly rounded enough for the trick).

Interpreter quirks (triton 3.7.1, see ``backends/triton.py``): bf16/fp16 tiles are
upcast to fp32 before ``tl.dot`` (the interpreter multiplies bf16 bit patterns),
and bf16 results are rounded to nearest even explicitly (its fp32 -> bf16 cast
truncates).  Under the interpreter the blocks cover as much of the sequence as
possible (each program costs milliseconds); on a GPU tiles follow the head dim
(chosen without GPU measurements: the configs compile for sm_90 with at most ~160 KB
of shared memory for fp32 at D=128, but were not tuned or run on a device).
The backward kernels live in ``triton_bwd.py``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2
from ...backends.triton_lang import round_bf16 as _round_bf16

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


@triton.jit
def _tanh(x, INTERP: tl.constexpr):
    if INTERP:
        a = tl.abs(x)
        y = -2.0 * a
        u = tl.exp(y)
        lu = tl.log(tl.where((u == 1.0) | (u == 0.0), 0.5, u))
        # Kahan: expm1(y) = (u - 1) * y / log(u) with u = fl(exp(y)); exact ends handled apart
        e = tl.where(u == 1.0, y, tl.where(u == 0.0, -1.0, (u - 1.0) * y / lu))
        t = -e / (2.0 + e)
        r = tl.where(x < 0, -t, t)
    else:
        r = libdevice.tanh(x)
    return r


@triton.jit
def _scores(q, k, rows, cols, Lq, Lk, off, scale, softcap, wl, wr,
            SOFTCAP: tl.constexpr, HAS_WL: tl.constexpr, HAS_WR: tl.constexpr, INTERP: tl.constexpr):
    """(BM, BN) fp32 scores of one tile, the tanh of the softcap (1 when off) and the allowed mask."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    t = s
    if SOFTCAP:
        t = _tanh(s / softcap, INTERP)
        s = softcap * t
    ok = (rows[:, None] < Lq) & (cols[None, :] < Lk)
    if HAS_WL:
        ok = ok & (cols[None, :] >= rows[:, None] + (off - wl))
    if HAS_WR:
        ok = ok & (cols[None, :] <= rows[:, None] + (off + wr))
    return s, t, ok


@triton.jit
def _seq_bounds(cu_q, cu_k, b):
    """Start and length of sequence b's queries and keys (int64: offsets never overflow)."""
    q0 = tl.load(cu_q + b).to(tl.int64)
    k0 = tl.load(cu_k + b).to(tl.int64)
    return q0, tl.load(cu_q + b + 1).to(tl.int64) - q0, k0, tl.load(cu_k + b + 1).to(tl.int64) - k0


@triton.jit
def _load_rows(ptr, t0, idx, L, stride_t, head_off, dcol, d_ok, UPCAST: tl.constexpr):
    """Tile [i, d] = ptr[(t0 + idx_i) * stride_t + head_off + d] for idx_i < L, d < D (else 0),
    upcast to fp32 under the interpreter; with its mask (the store of the same tile uses it)."""
    m = (idx < L)[:, None] & d_ok[None, :]
    x = tl.load(ptr + (t0 + idx).to(tl.int64)[:, None] * stride_t + head_off + dcol[None, :], mask=m, other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x, m


@triton.jit
def _key_range(m0, Lq, Lk, off, wl, wr, HAS_WL: tl.constexpr, HAS_WR: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, hi): the keys any query row of the block at m0 may see (lo rounded down to BLOCK_N)."""
    lo = m0 * 0
    hi = Lk
    if HAS_WL:
        lo = tl.maximum(m0 + off - wl, 0)
    if HAS_WR:
        hi = tl.minimum(hi, tl.minimum(m0 + BLOCK_M, Lq) + off + wr)
    return (lo // BLOCK_N) * BLOCK_N, hi


@triton.jit
def _row_stats(lse_ptr, dl_ptr, h, Tq, q0, rows, row_ok):
    """The saved lse (a keyless row's -inf read as +inf, so P = exp(s - lse) = 0) and D of rows."""
    lse = tl.load(lse_ptr + h * Tq + q0 + rows, mask=row_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse, tl.load(dl_ptr + h * Tq + q0 + rows, mask=row_ok, other=0.0)


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q, cu_k,
                     sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                     Tq, Hq, D, group, scale, softcap, wl, wr,
                     SOFTCAP: tl.constexpr, HAS_WL: tl.constexpr, HAS_WR: tl.constexpr,
                     UPCAST: tl.constexpr, RNE_BF16: tl.constexpr, INTERP: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    q0, Lq, k0, Lk = _seq_bounds(cu_q, cu_k, b)
    m0 = pid_m * BLOCK_M
    if m0 < Lq:
        off = Lk - Lq
        hk = (h // group).to(tl.int64)
        rows = m0 + tl.arange(0, BLOCK_M)
        dcol = tl.arange(0, BLOCK_D)
        row_ok = rows < Lq
        d_ok = dcol < D
        q, qm = _load_rows(q_ptr, q0, rows, Lq, sq_t, h * sq_h, dcol, d_ok, UPCAST)
        lo, hi = _key_range(m0, Lq, Lk, off, wl, wr, HAS_WL, HAS_WR, BLOCK_M, BLOCK_N)
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            k, km = _load_rows(k_ptr, k0, cols, Lk, sk_t, hk * sk_h, dcol, d_ok, UPCAST)
            v, km = _load_rows(v_ptr, k0, cols, Lk, sv_t, hk * sv_h, dcol, d_ok, UPCAST)
            s, t, ok = _scores(q, k, rows, cols, Lq, Lk, off, scale, softcap, wl, wr,
                               SOFTCAP, HAS_WL, HAS_WR, INTERP)
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(m_i - shift)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        empty = l_i == 0.0
        o = acc / tl.where(empty, 1.0, l_i)[:, None]
        o = _round_bf16(o, RNE_BF16)
        o_off = (q0 + rows).to(tl.int64)[:, None] * (Hq * D) + h.to(tl.int64) * D + dcol[None, :]
        tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=qm)
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        tl.store(lse_ptr + h.to(tl.int64) * Tq + q0 + rows, lse, mask=row_ok)


def block_d(D: int) -> int:
    return max(16, next_pow2(D))


def fwd_config(max_q: int, max_k: int, D: int, device: torch.device) -> dict:
    """Tile sizes: the whole (small) sequence under the interpreter, per head dim on a GPU."""
    if interpreted() or device.type != "cuda":
        bm = min(256, max(16, next_pow2(max_q)))
        bn = min(256, max(16, next_pow2(max_k)))
        return dict(BLOCK_M=bm, BLOCK_N=bn)
    bd = block_d(D)
    if bd <= 64:
        bm, bn, warps, stages = 128, 64, 4, 3
    elif bd <= 128:
        bm, bn, warps, stages = 128, 64, 8, 2
    else:
        bm, bn, warps, stages = 64, 32, 4, 2
    bm = min(bm, max(16, next_pow2(max_q)))
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def flags(dtype: torch.dtype, softcap: float, window_left: int, window_right: int) -> dict:
    interp = interpreted()
    return dict(SOFTCAP=softcap > 0, HAS_WL=window_left >= 0, HAS_WR=window_right >= 0,
                UPCAST=interp and dtype != torch.float32, RNE_BF16=interp and dtype == torch.bfloat16,
                INTERP=interp)


def unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _check_dim(D: int) -> None:
    if D > MAX_HEAD_DIM:
        raise ValueError(f"tessera.attention (triton): head dim D={D} is larger than the "
                         f"supported maximum {MAX_HEAD_DIM}")


def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, exact_lse=True):
    Tq, Hq, D = q.shape
    Hk = k.shape[1]
    _check_dim(D)
    q, k, v = unit_last(q), unit_last(k), unit_last(v)
    out = new_output((Tq, Hq, D), q.dtype, q.device)
    lse = new_output((Hq, Tq), torch.float32, q.device)
    B = cu_q.shape[0] - 1
    if Tq == 0 or Hq == 0 or B <= 0 or max_q <= 0:
        return out, lse
    cfg = fwd_config(max_q, max_k, D, q.device)
    grid = (triton.cdiv(max_q, cfg["BLOCK_M"]), Hq, B)
    _attn_fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        Tq, Hq, D, Hq // Hk, float(scale), float(softcap), int(window_left), int(window_right),
        BLOCK_D=block_d(D), **flags(q.dtype, softcap, window_left, window_right), **cfg)
    return out, lse


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap):
    from .triton_bwd import backward as _backward
    return _backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale,
                     window_left, window_right, softcap)
