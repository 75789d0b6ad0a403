"""Attention Triton backward kernels (FlashAttention-2 backward, race-free two-kernel scheme).

With P = exp(s - lse) recomputed tile by tile from the saved fp32 lse (a row with
lse = -inf has P = 0, so its gradients are 0), D_i = <dout_i, out_i>:

    dv_j = sum_i P_ij dout_i
    dS_ij = P_ij (<dout_i, v_j> - D_i);   softcap: dS_ij *= 1 - tanh(s_raw_ij / c)^2
    dq_i = scale * sum_j dS_ij k_j;       dk_j = scale * sum_i dS_ij q_i

Kernels (Dao, "FlashAttention-2", 2023, Algorithm 2, split as in Triton's fused
attention tutorial so no atomics are needed and results are deterministic):

1. ``_attn_bwd_delta_kernel``: D_i = <dout_i, out_i> in fp32, (Hq, Tq), taken as the
   diagonal of the tile product dout @ out^T rather than an elementwise sum: the
   reduction then runs exactly like the dP = dout @ v^T products of the other
   kernels, so a one-hot row (a single allowed key, or scores ~1e4 apart), where
   out_i == v_j bit for bit, gets dP_ij - D_i = 0 exactly and gradients of exactly
   0 as the math says (an elementwise sum rounds differently and leaves ~1e-7);
2. ``_attn_bwd_dkdv_kernel``: one program per (key block, kv head, sequence); it
   keeps its k, v tiles and fp32 dk, dv accumulators in registers and loops over
   the q heads of its GQA group and, for each, over the query blocks that may see
   its keys (causal/window limits), so dk/dv come out already summed over the group;
3. ``_attn_bwd_dq_kernel``: one program per (query block, q head, sequence) looping
   over key blocks as the forward does.

Scores are recomputed with the forward's own tile function (``triton._scores``), so
masks, softcap and bottom-right alignment match exactly.  Every output token is
written by exactly one program (cu_q[-1] == Tq and cu_k[-1] == Tk, as the public
layer guarantees); keys no query sees get dk = dv = 0.  Offsets are int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2
from .triton import (_check_dim, _key_range, _load_rows, _round_bf16, _row_stats, _scores, _seq_bounds, block_d,
                      flags, unit_last)


@triton.jit
def _attn_bwd_delta_kernel(do_ptr, o_ptr, dl_ptr, sd_t, sd_h, Tq, Hq, D,
                           UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """D[h, t] = <dout_t, out_t> as the diagonal of the tile product dout @ out^T (see module doc)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1).to(tl.int64)
    dcol = tl.arange(0, BLOCK_D)
    row_ok = rows < Tq
    do, m = _load_rows(do_ptr, 0, rows, Tq, sd_t, h * sd_h, dcol, dcol < D, UPCAST)
    o, m = _load_rows(o_ptr, 0, rows, Tq, Hq * D, h * D, dcol, dcol < D, UPCAST)
    dd = tl.dot(do, tl.trans(o), input_precision="ieee")
    diag = tl.sum(tl.where(rows[:, None] == rows[None, :], dd, 0.0), axis=1)
    tl.store(dl_ptr + h * Tq + rows, diag, mask=row_ok)


@triton.jit
def _attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, dl_ptr, dk_ptr, dv_ptr, cu_q, cu_k,
                          sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sd_t, sd_h,
                          Tq, Hk, D, group, scale, softcap, wl, wr,
                          SOFTCAP: tl.constexpr, HAS_WL: tl.constexpr, HAS_WR: tl.constexpr,
                          UPCAST: tl.constexpr, RNE_BF16: tl.constexpr, INTERP: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_n = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    q0, Lq, k0, Lk = _seq_bounds(cu_q, cu_k, b)
    n0 = pid_n * BLOCK_N
    if n0 < Lk:
        off = Lk - Lq
        cols = n0 + tl.arange(0, BLOCK_N)
        dcol = tl.arange(0, BLOCK_D)
        d_ok = dcol < D
        k, km = _load_rows(k_ptr, k0, cols, Lk, sk_t, hk * sk_h, dcol, d_ok, UPCAST)
        v, km = _load_rows(v_ptr, k0, cols, Lk, sv_t, hk * sv_h, dcol, d_ok, UPCAST)
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        # queries that may see any key of this block: [lo, hi)
        lo = n0 * 0
        hi = Lq
        if HAS_WR:
            lo = tl.maximum(n0 - off - wr, 0)
        if HAS_WL:
            hi = tl.minimum(hi, tl.minimum(n0 + BLOCK_N, Lk) - off + wl)
        lo = (lo // BLOCK_M) * BLOCK_M
        for g in range(0, group):
            h = hk * group + g
            for m0 in range(lo, hi, BLOCK_M):
                rows = m0 + tl.arange(0, BLOCK_M)
                q, qm = _load_rows(q_ptr, q0, rows, Lq, sq_t, h * sq_h, dcol, d_ok, UPCAST)
                do, qm = _load_rows(do_ptr, q0, rows, Lq, sd_t, h * sd_h, dcol, d_ok, UPCAST)
                lse, dl = _row_stats(lse_ptr, dl_ptr, h, Tq, q0, rows, rows < Lq)
                s, t, ok = _scores(q, k, rows, cols, Lq, Lk, off, scale, softcap, wl, wr,
                                   SOFTCAP, HAS_WL, HAS_WR, INTERP)
                p = tl.exp(tl.where(ok, s, float("-inf")) - lse[:, None])  # masked or keyless: 0
                dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision="ieee")
                dp = tl.dot(do, tl.trans(v), input_precision="ieee")
                ds = p * (dp - dl[:, None])
                if SOFTCAP:
                    ds = ds * (1.0 - t * t)
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision="ieee")
        dk = _round_bf16(dk * scale, RNE_BF16)
        dv = _round_bf16(dv, RNE_BF16)
        o_off = (k0 + cols).to(tl.int64)[:, None] * (Hk * D) + hk * D + dcol[None, :]
        tl.store(dk_ptr + o_off, dk.to(dk_ptr.dtype.element_ty), mask=km)
        tl.store(dv_ptr + o_off, dv.to(dv_ptr.dtype.element_ty), mask=km)


@triton.jit
def _attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, dl_ptr, dq_ptr, cu_q, cu_k,
                        sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sd_t, sd_h,
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
        hk = h // group
        rows = m0 + tl.arange(0, BLOCK_M)
        dcol = tl.arange(0, BLOCK_D)
        d_ok = dcol < D
        q, qm = _load_rows(q_ptr, q0, rows, Lq, sq_t, h * sq_h, dcol, d_ok, UPCAST)
        do, qm = _load_rows(do_ptr, q0, rows, Lq, sd_t, h * sd_h, dcol, d_ok, UPCAST)
        lse, dl = _row_stats(lse_ptr, dl_ptr, h, Tq, q0, rows, rows < Lq)
        lo, hi = _key_range(m0, Lq, Lk, off, wl, wr, HAS_WL, HAS_WR, BLOCK_M, BLOCK_N)
        dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            k, km = _load_rows(k_ptr, k0, cols, Lk, sk_t, hk * sk_h, dcol, d_ok, UPCAST)
            v, km = _load_rows(v_ptr, k0, cols, Lk, sv_t, hk * sv_h, dcol, d_ok, UPCAST)
            s, t, ok = _scores(q, k, rows, cols, Lq, Lk, off, scale, softcap, wl, wr,
                               SOFTCAP, HAS_WL, HAS_WR, INTERP)
            p = tl.exp(tl.where(ok, s, float("-inf")) - lse[:, None])  # masked or keyless: 0
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - dl[:, None])
            if SOFTCAP:
                ds = ds * (1.0 - t * t)
            dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
        dq = _round_bf16(dq * scale, RNE_BF16)
        qt = (q0 + rows).to(tl.int64)[:, None]
        tl.store(dq_ptr + qt * (Hq * D) + h * D + dcol[None, :], dq.to(dq_ptr.dtype.element_ty), mask=qm)


def bwd_config(max_q: int, max_k: int, D: int, device: torch.device) -> tuple[dict, dict]:
    """(dk/dv config, dq config): whole small sequences under the interpreter."""
    if interpreted() or device.type != "cuda":
        bm = min(256, max(16, next_pow2(max_q)))
        bn = min(256, max(16, next_pow2(max_k)))
        return dict(BLOCK_M=bm, BLOCK_N=bn), dict(BLOCK_M=bm, BLOCK_N=bn)
    bd = block_d(D)
    if bd <= 128:
        kv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2)
        dq = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    else:
        kv = dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
        dq = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    return kv, dq


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap):
    Tq, Hq, D = q.shape
    Tk, Hk, _ = k.shape
    _check_dim(D)
    dq = new_output((Tq, Hq, D), q.dtype, q.device)
    dk = new_output((Tk, Hk, D), k.dtype, k.device)
    dv = new_output((Tk, Hk, D), v.dtype, v.device)
    B = cu_q.shape[0] - 1
    if B <= 0 or Hq == 0 or (Tq == 0 and Tk == 0):
        return dq, dk, dv
    q, k, v, dout = unit_last(q), unit_last(k), unit_last(v), unit_last(dout)
    out, lse = out.contiguous(), lse.contiguous()
    kv_cfg, dq_cfg = bwd_config(max_q, max_k, D, q.device)
    fl = flags(q.dtype, softcap, window_left, window_right)
    delta = new_output((Hq, Tq), torch.float32, q.device)  # laid out like lse; kernel-written
    if Tq > 0:
        bm = min(256, max(16, next_pow2(Tq))) if interpreted() or q.device.type != "cuda" else 64
        _attn_bwd_delta_kernel[(triton.cdiv(Tq, bm), Hq)](dout, out, delta, dout.stride(0), dout.stride(1),
                                                          Tq, Hq, D, UPCAST=fl["UPCAST"], BLOCK_M=bm,
                                                          BLOCK_D=block_d(D))
    common = (cu_q, cu_k, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
              dout.stride(0), dout.stride(1), Tq)
    tail = (D, Hq // Hk, float(scale), float(softcap), int(window_left), int(window_right))
    kw = dict(BLOCK_D=block_d(D), **fl)
    if Tk > 0 and max_k > 0:
        grid = (triton.cdiv(max_k, kv_cfg["BLOCK_N"]), Hk, B)
        _attn_bwd_dkdv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, *common, Hk, *tail, **kw, **kv_cfg)
    if Tq > 0 and max_q > 0:
        grid = (triton.cdiv(max_q, dq_cfg["BLOCK_M"]), Hq, B)
        _attn_bwd_dq_kernel[grid](q, k, v, dout, lse, delta, dq, *common, Hq, *tail, **kw, **dq_cfg)
    return dq, dk, dv
