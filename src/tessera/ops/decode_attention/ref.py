"""Paged decode attention: float64 reference, plain-PyTorch baseline, ``reference`` backend kernel.

For sequence b with n = seq_lens[b] cached tokens (token t in page block_table[b, t // P], slot
t % P), query head j and its kv head j // (Hq / Hk):

    keys     t in [lo, n),  lo = max(0, n - window) if window > 0 else 0
    s_t      = scale * <q_j, k_t>          (k_t = q8 * k_scale for int8/fp8 caches)
    s_t      = softcap * tanh(s_t / softcap)   when softcap > 0
    out_j    = sum_t softmax(s)_t v_t      (0 when there is no key)
"""
from __future__ import annotations

import math

import torch

from ...backends.reference import up
from ..append_kv.ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _deq(cache, scale):
    return up(cache) if scale is None else cache.double() * scale.double()[..., None]


def decode_attention_ref(q, k_cache, v_cache, block_table, seq_lens, scale=None, softcap=0.0, window=-1,
                         k_scale=None, v_scale=None):
    """Float64 reference (returns float64 (B, Hq, D))."""
    B, Hq, D = q.shape
    P, Hk = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hk
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    K, V, q64 = _deq(k_cache, k_scale), _deq(v_cache, v_scale), up(q)
    out = torch.zeros(B, Hq, D, dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        lo = max(0, n - window) if window > 0 else 0
        if n <= lo:
            continue
        t = torch.arange(lo, n, device=q.device)
        pages = block_table[b].long()[t // P]
        kk = K[pages, t % P].repeat_interleave(G, dim=1)  # (L, Hq, D)
        vv = V[pages, t % P].repeat_interleave(G, dim=1)
        s = torch.einsum("hd,lhd->hl", q64[b], kk) * sc
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, -1), vv)
    return out


def gather(cache, scale, block_table, seq_lens, window, dtype):
    """Contiguous (B, Hk, L, D) keys/values in ``dtype`` (dequantised), zeros past each sequence,
    and the (B, L) mask of attended positions.  L is the block table's capacity (max_blocks * P),
    not the longest sequence: a shape that does not depend on seq_lens' values is what a padded
    serving batch uses, and what lets torch.compile(fullgraph=True) trace this baseline."""
    P = cache.shape[1]
    n = seq_lens.long()
    L = block_table.shape[1] * P
    t = torch.arange(L, device=cache.device)
    valid = t[None, :] < n[:, None]
    if window > 0:
        valid &= t[None, :] >= (n[:, None] - window)
    pages = torch.where(valid, block_table.long()[:, t // P], 0)
    x = cache[pages, t % P]
    x = x.to(dtype) if scale is None else (x.float() * scale[pages, t % P][..., None]).to(dtype)
    x = torch.where(valid[..., None, None], x, torch.zeros((), dtype=dtype, device=x.device))
    return x.transpose(1, 2), valid


def decode_attention_eager(q, k_cache, v_cache, block_table, seq_lens, scale=None, softcap=0.0, window=-1,
                           k_scale=None, v_scale=None):
    """What a user writes: gather the pages, dequantise, SDPA in q's dtype (manual math for softcap)."""
    B, Hq, D = q.shape
    sc = 1.0 / math.sqrt(D) if scale is None else scale
    K, valid = gather(k_cache, k_scale, block_table, seq_lens, window, q.dtype)
    V, _ = gather(v_cache, v_scale, block_table, seq_lens, window, q.dtype)
    if K.shape[2] == 0:
        return torch.zeros_like(q)
    mask = valid[:, None, None, :]
    if softcap > 0:
        G = Hq // K.shape[1]
        K, V = K.repeat_interleave(G, dim=1), V.repeat_interleave(G, dim=1)
        s = (q[:, :, None, :] @ K.transpose(-1, -2)) * sc
        s = softcap * torch.tanh(s / softcap)
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        out = (p.nan_to_num(0.0) @ V)[:, :, 0]
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], K, V, attn_mask=mask, scale=sc,
                                                               enable_gqa=True)[:, :, 0]
    return torch.where(valid.any(1)[:, None, None], out, torch.zeros((), dtype=q.dtype))


# ---------------------------------------------------------------- reference backend kernel

def keys_read(seq_lens, window: int) -> torch.Tensor:
    """Keys each sequence attends to: its length, or the last ``window`` of them."""
    n = seq_lens.long()
    return n.clamp(max=window) if window > 0 else n


def forward(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, max_keys=None):
    return decode_attention_ref(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale,
                                v_scale).to(q.dtype)


def backward(*args):
    raise NotImplementedError("decode_attention has no gradient (inference only)")
