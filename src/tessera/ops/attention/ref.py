"""Attention float64 reference, the plain-PyTorch baseline, and the ``reference`` backend kernels.

For one sequence (Lq queries, Lk keys, off = Lk - Lq: bottom-right alignment as in FlashAttention),
query i, key j:

    allowed(i, j) = (wl < 0 or j >= i + off - wl) and (wr < 0 or j <= i + off + wr)   (causal: wr = 0)
    s_ij   = scale * <q_i, k_j>;   s_ij = softcap * tanh(s_ij / softcap) when softcap > 0
    lse_i  = log sum_{allowed j} exp(s_ij)            (-inf when nothing is allowed)
    out_i  = sum_j exp(s_ij - lse_i) v_j              (0 when nothing is allowed, never NaN)

GQA/MQA: q head h reads kv head h // (Hq // Hk).  Backward (closed form, used by the reference
backend): P = exp(s - lse), dP = dout v^T, D_i = sum_j P_ij dP_ij (= <dout_i, out_i>),
dS = P (dP - D), times (1 - (s/softcap)^2) under a softcap; dq = scale dS k, dk = scale dS^T q,
dv = P^T dout, dk/dv summed over each GQA group.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...backends.reference import up

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def window_bounds(causal: bool, window) -> tuple[int, int]:
    """(window_left, window_right) with -1 = unbounded; causal caps the right side at 0."""
    wl, wr = int(window[0]), int(window[1])
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    return wl, wr


def allowed_mask(Lq: int, Lk: int, wl: int, wr: int, device=None) -> torch.Tensor:
    """Boolean (Lq, Lk): which keys query i may attend to (bottom-right aligned)."""
    i = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    j = torch.arange(Lk, device=device)[None, :]
    ok = torch.ones(Lq, Lk, dtype=torch.bool, device=device)
    if wl >= 0:
        ok &= j >= i - wl
    if wr >= 0:
        ok &= j <= i + wr
    return ok


def _bounds(cu):
    return [int(x) for x in cu.tolist()]


def _split(q, k, v, cu_q, cu_k):
    """-> list of (q_b, k_b, v_b) in packed (L, H, D) form, and a function re-assembling outputs."""
    if cu_q is None:
        B = q.shape[0]
        return [(q[b], k[b], v[b]) for b in range(B)], True
    bq, bk = _bounds(cu_q), _bounds(cu_k)
    return [(q[bq[b]:bq[b + 1]], k[bk[b]:bk[b + 1]], v[bk[b]:bk[b + 1]]) for b in range(len(bq) - 1)], False


def _seq_fwd(q, k, v, scale, wl, wr, softcap):
    """One sequence, in q's dtype (autograd-friendly): q (Lq, Hq, D), k/v (Lk, Hk, D)
    -> out (Lq, Hq, D), lse (Hq, Lq)."""
    Lq, Hq, D = q.shape
    Lk, Hk = k.shape[0], k.shape[1]
    if Lq == 0 or Lk == 0:
        out = q.new_zeros(Lq, Hq, D) + 0 * q.sum() + 0 * k.sum() + 0 * v.sum()
        return out, torch.full((Hq, Lq), -math.inf, dtype=q.dtype, device=q.device)
    g = Hq // Hk
    kh = k.repeat_interleave(g, dim=1).transpose(0, 1)          # (Hq, Lk, D)
    vh = v.repeat_interleave(g, dim=1).transpose(0, 1)
    s = (q.transpose(0, 1) @ kh.transpose(1, 2)) * scale       # (Hq, Lq, Lk)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~allowed_mask(Lq, Lk, wl, wr, q.device), -math.inf)
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    out = (p @ vh) / torch.where(l > 0, l, torch.ones_like(l))
    lse = (torch.log(l.detach()) + m).squeeze(-1)
    return out.transpose(0, 1), lse


def _resolve(q, scale, causal, window):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return scale, *window_bounds(causal, window)


def _assemble(outs, lses, batched, q):
    if batched:
        if not outs:
            return q * 0, q.new_zeros(0, q.shape[2], q.shape[1])
        return torch.stack(outs), torch.stack(lses)
    out = torch.cat(outs) if outs else q * 0
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0)
    return out, lse


def attention_ref(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False):
    """Float64 reference of ``tessera.attention`` (returns float64; lse (B, H, Sq) or (H, Tq))."""
    scale, wl, wr = _resolve(q, scale, causal, window)
    seqs, batched = _split(up(q), up(k), up(v), cu_seqlens_q, cu_seqlens_k)
    res = [_seq_fwd(a, b, c, scale, wl, wr, float(softcap)) for a, b, c in seqs]
    out, lse = _assemble([r[0] for r in res], [r[1] for r in res], batched, up(q))
    return (out, lse) if return_lse else out


def attention_eager(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, cu_seqlens_q=None,
                    cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False):
    """Plain PyTorch in the input dtype: ``F.scaled_dot_product_attention`` per batch/sequence, with an
    explicit boolean mask for bottom-right causal / windows; plain math (softmax) with a softcap."""
    scale_v, wl, wr = _resolve(q, scale, causal, window)
    seqs, batched = _split(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if batched and q.shape[0] > 0:
        seqs = [(q, k, v)]                  # one batched SDPA call (the benchmark baseline)
    outs, lses = [], []
    for a, b, c in seqs:
        if not batched:
            a, b, c = a[None], b[None], c[None]
        Lq, Lk = a.shape[1], b.shape[1]
        qt, kt, vt = a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)   # (N, H, L, D)
        gqa = qt.shape[1] != kt.shape[1]
        mask = None if (wl < 0 and wr < 0) else allowed_mask(Lq, Lk, wl, wr, q.device)
        if Lk == 0 or Lq == 0:
            o = qt * 0 + (kt.sum() + vt.sum()) * 0
            lse = qt.new_full(qt.shape[:-1], -math.inf)
        else:
            g = qt.shape[1] // kt.shape[1]
            if softcap > 0 or return_lse:  # plain math; q and k pre-scaled by sqrt(scale) as SDPA's math path
                rs = math.sqrt(scale_v)
                s = (qt * rs) @ (kt.repeat_interleave(g, 1) * rs).transpose(-1, -2)
                if softcap > 0:
                    s = softcap * torch.tanh(s / softcap)
                if mask is not None:
                    s = s.masked_fill(~mask, -math.inf)
                lse = torch.logsumexp(s.float(), -1)
            if softcap > 0:
                p = torch.softmax(s, -1)
                p = torch.where(torch.isnan(p), torch.zeros_like(p), p)   # rows without keys: 0, not NaN
                o = p @ vt.repeat_interleave(g, 1)
            else:
                is_causal = mask is not None and Lq == Lk and wl < 0 and wr == 0
                o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=None if is_causal else mask,
                                                   is_causal=is_causal, scale=scale_v, enable_gqa=gqa)
                lse = lse if return_lse else None
        o = o.transpose(1, 2)
        if batched:
            outs.append(o)
            lses.append(lse)
        else:
            outs.append(o[0])
            lses.append(None if lse is None else lse[0])
    if batched:
        out = outs[0] if outs else q * 0
        lse = lses[0] if lses and lses[0] is not None else q.new_zeros(q.shape[0], q.shape[2], q.shape[1])
    else:
        out = torch.cat(outs) if outs else q * 0
        lse = torch.cat([x if x is not None else q.new_zeros(q.shape[1], o.shape[0]) for x, o in zip(lses, outs)],
                        dim=1) if outs else q.new_zeros(q.shape[1], 0)
    return (out, lse.float()) if return_lse else out


# ---------------------------------------------------------------- reference backend kernels

def _seqs(cu_q, cu_k):
    bq, bk = cu_q.tolist(), cu_k.tolist()
    return [(bq[b], bq[b + 1], bk[b], bk[b + 1]) for b in range(len(bq) - 1)]


def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, exact_lse=True):
    Tq, Hq, D = q.shape
    out = torch.zeros(Tq, Hq, D, dtype=torch.float64, device=q.device)
    lse = torch.full((Hq, Tq), -math.inf, dtype=torch.float64, device=q.device)
    for q0, q1, k0, k1 in _seqs(cu_q, cu_k):
        o, l = _seq_fwd(up(q[q0:q1]), up(k[k0:k1]), up(v[k0:k1]), scale, window_left, window_right, softcap)
        out[q0:q1], lse[:, q0:q1] = o, l
    return out.to(q.dtype), lse.to(torch.float32)


def _seq_bwd(do, q, k, v, scale, wl, wr, softcap):
    Lq, Hq, D = q.shape
    Lk, Hk = k.shape[0], k.shape[1]
    g = Hq // Hk
    kh = k.repeat_interleave(g, dim=1).transpose(0, 1)
    vh = v.repeat_interleave(g, dim=1).transpose(0, 1)
    qh, doh = q.transpose(0, 1), do.transpose(0, 1)               # (Hq, Lq, D)
    s = (qh @ kh.transpose(1, 2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    allowed = allowed_mask(Lq, Lk, wl, wr, q.device)
    s = s.masked_fill(~allowed, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    p = p / torch.where(l > 0, l, torch.ones_like(l))
    dp = doh @ vh.transpose(1, 2)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True))
    if softcap > 0:
        ds = ds * (1 - (torch.where(allowed, s, torch.zeros_like(s)) / softcap) ** 2)
    dq = scale * ds @ kh
    dk = (scale * ds.transpose(1, 2) @ qh).reshape(Hk, g, Lk, D).sum(1)
    dv = (p.transpose(1, 2) @ doh).reshape(Hk, g, Lk, D).sum(1)
    return dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1)


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap):
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    for q0, q1, k0, k1 in _seqs(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        a, b, c = _seq_bwd(up(dout[q0:q1]), up(q[q0:q1]), up(k[k0:k1]), up(v[k0:k1]), scale,
                           window_left, window_right, softcap)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = a, b, c
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
