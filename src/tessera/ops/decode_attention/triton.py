"""Paged decode attention Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

Split kernel: grid (B, Hk, S); program (b, h, s) takes the keys of split s of sequence b for
the whole GQA group of kv head h (q: BLOCK_G x BLOCK_D in registers), walks them in tiles of
BLOCK_N tokens gathered through the page table, and keeps an online softmax (m, l, acc) in
fp32; it stores its partial (m, l, acc).  Combine kernel: grid (B, Hq), merges the S partials.

int8 caches: the k_scale of each token multiplies its score and v_scale its probability (the
dequantisation x = q * scale, folded).  float8_e4m3fn caches are read as uint8 and decoded with
integer ops (magnitude bits << 20 reinterpreted as fp32, times 2^120; 0x7f/0xff are NaN), so no
fp8 load is needed (the interpreter cannot load fp8 with ``other=``).  Scores are reduced with
broadcast-multiply-sum rather than ``tl.dot`` (G may be below the 16-row minimum of dot).
softcap uses tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|) (no libdevice under the interpreter).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ...backends.triton import interpreted, next_pow2
from ..append_kv.ref import CACHE_DTYPES  # noqa: F401  (every cache dtype, fp8 via uint8)
from .ref import keys_read

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KIND = {torch.int8: 1, torch.float8_e4m3fn: 2}


@triton.jit
def _load_kv(ptr, off, mask, KIND: tl.constexpr):
    x = tl.load(ptr + off, mask=mask, other=0)
    if KIND == 2:
        u = x.to(tl.int32)
        f = ((u & 0x7F) << 20).to(tl.float32, bitcast=True) * 1.329227995784916e+36  # 2^120
        f = tl.where((u & 0x80) != 0, -f, f)
        return tl.where((u & 0x7F) == 0x7F, float("nan"), f)
    return x.to(tl.float32)


@triton.jit
def _split_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, sl_ptr, pm_ptr, pl_ptr, pa_ptr,
                  MB, P, S, scale, softcap, window,
                  HQ: tl.constexpr, HK: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  KIND: tl.constexpr, SOFTCAP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2)
    n = tl.load(sl_ptr + b)
    lo = tl.where(window > 0, tl.maximum(n - window, 0), 0)
    per = tl.cdiv(n - lo, S)
    t0 = lo + sp * per
    t1 = tl.minimum(t0 + per, n)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gm, dm = g < G, d < D
    q = tl.load(q_ptr + (b * HQ + h * G + g)[:, None] * D + d[None, :], mask=gm[:, None] & dm[None, :],
                other=0.0).to(tl.float32) * scale
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(t0, t1, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        tm = t < t1
        page = tl.load(bt_ptr + b * MB + t // P, mask=tm, other=0).to(tl.int64)
        row = page * P + t % P
        off = (row * HK + h)[:, None] * D + d[None, :]
        km = tm[:, None] & dm[None, :]
        k = _load_kv(kc_ptr, off, km, KIND)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # (BLOCK_G, BLOCK_N)
        if KIND != 0:
            s = s * tl.load(ks_ptr + row * HK + h, mask=tm, other=0.0)[None, :]
        if SOFTCAP:
            x = s / softcap
            e = tl.exp(-2.0 * tl.abs(x))
            th = (1.0 - e) / (1.0 + e)
            s = softcap * tl.where(x < 0, -th, th)
        s = tl.where(tm[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = _load_kv(vc_ptr, off, km, KIND)
        if KIND != 0:
            p = p * tl.load(vs_ptr + row * HK + h, mask=tm, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    task = (b * HK + h) * S + sp
    tl.store(pm_ptr + task * G + g, m, mask=gm)
    tl.store(pl_ptr + task * G + g, l, mask=gm)
    tl.store(pa_ptr + (task * G + g)[:, None] * D + d[None, :], acc, mask=gm[:, None] & dm[None, :])


@triton.jit
def _combine_kernel(pm_ptr, pl_ptr, pa_ptr, o_ptr, S, HQ: tl.constexpr, HK: tl.constexpr, G: tl.constexpr,
                    D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    h, g = j // G, j % G
    sidx = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    sm, dm = sidx < S, d < D
    task = (b * HK + h) * S + sidx
    ms = tl.load(pm_ptr + task * G + g, mask=sm, other=float("-inf"))
    ls = tl.load(pl_ptr + task * G + g, mask=sm, other=0.0)
    M = tl.max(ms, axis=0)
    M = tl.where(M == float("-inf"), 0.0, M)
    w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - M))
    L = tl.sum(w * ls, axis=0)
    a = tl.load(pa_ptr + (task * G + g)[:, None] * D + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    acc = tl.sum(w[:, None] * a, axis=0)
    out = tl.where(L > 0, acc / tl.where(L > 0, L, 1.0), 0.0)
    tl.store(o_ptr + (b * HQ + j) * D + d, out.to(o_ptr.dtype.element_ty), mask=dm)


def _splits(B, Hk, max_keys, device):
    if interpreted() or device.type != "cuda":
        return 2 if max_keys > 64 else 1  # few programs, but the combine of several splits is exercised
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(2 * sms, max(1, B * Hk)), triton.cdiv(max_keys, 256)))


def forward(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, max_keys=None):
    B, Hq, D = q.shape
    Hk, P = k_cache.shape[2], k_cache.shape[1]
    G = Hq // Hk
    out = new_output((B, Hq, D), q.dtype, q.device)
    if B == 0:
        return out
    if max_keys is None:
        max_keys = int(keys_read(seq_lens, window).max())
    S = _splits(B, Hk, max_keys, q.device)
    kind = _KIND.get(k_cache.dtype, 0)
    kc, vc = (k_cache.view(torch.uint8), v_cache.view(torch.uint8)) if kind == 2 else (k_cache, v_cache)
    # split partials: kernel-written workspaces, so new_output (poisoned / fenced under test)
    pm = new_output((B * Hk * S * G,), torch.float32, q.device)
    pl = new_output((B * Hk * S * G,), torch.float32, q.device)
    pa = new_output((B * Hk * S * G * D,), torch.float32, q.device)
    ks = k_scale if k_scale is not None else pm
    vs = v_scale if v_scale is not None else pm
    BLOCK_N = 32 if interpreted() else 16
    _split_kernel[(B, Hk, S)](q, kc, vc, ks, vs, block_table, seq_lens, pm, pl, pa, block_table.shape[1], P, S,
                              scale, softcap if softcap > 0 else 1.0, window, HQ=Hq, HK=Hk, G=G, D=D,
                              BLOCK_G=next_pow2(G), BLOCK_D=next_pow2(D), BLOCK_N=BLOCK_N, KIND=kind,
                              SOFTCAP=softcap > 0)
    _combine_kernel[(B, Hq)](pm, pl, pa, out, S, HQ=Hq, HK=Hk, G=G, D=D, BLOCK_S=next_pow2(S),
                             BLOCK_D=next_pow2(D))
    return out


def backward(*args):
    raise NotImplementedError("decode_attention has no gradient (inference only)")
