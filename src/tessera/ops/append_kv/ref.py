"""append_kv reference (the quantisation contract, in torch) and the ``reference`` backend kernel.

Quantisation of one (token, head) vector x of D values (the integer contract of
``shared/notes/numerics.md``; every backend reproduces it bit for bit):

    x      = fp32(x)                              (upcast of the fp32/fp16/bf16 input)
    amax   = max_d |x_d|      NaN entries count as 0; an inf entry gives amax = inf
    scale  = max(amax, 1e-12f) / QMAX             one correctly rounded fp32 division
    q_d    = x_d / scale                          correctly rounded fp32 division
    int8   : q = saturate(rint(q), -127, 127)     rint = round half to even
    e4m3fn : q = fp8_rne(clamp(q, -448, 448))     round to nearest even, OCP e4m3fn (max 448)
    NaN -> 0 (a NaN input entry, and every entry of a vector holding inf: inf/inf is NaN)

QMAX = 127 (int8) or 448 (float8_e4m3fn); stored scale = ``scale`` (float32, per token and
head); dequantisation is ``q * scale``.  The scale is computed in fp32, not float64: the
contract is defined in fp32 so that kernels can match it exactly.
"""
from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
FLOAT_CACHES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = FLOAT_CACHES + tuple(QMAX)


def quantize(x: torch.Tensor, fmt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q of dtype ``fmt``, fp32 scale) per vector along the last dim, by the contract above."""
    x = x.float()
    amax = torch.where(torch.isnan(x), 0.0, x.abs()).amax(-1)
    scale = torch.clamp_min(amax, 1e-12) / QMAX[fmt]
    q = x / scale[..., None]
    q = torch.where(torch.isnan(q), 0.0, q)
    if fmt == torch.int8:
        return torch.round(q).clamp(-127, 127).to(torch.int8), scale
    return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double()[..., None]


def _slots(block_table, positions, n_new, page):
    """(page index, slot) of every new token: (B, n_new) each, long."""
    t = positions.long()[:, None] + torch.arange(n_new, device=positions.device)[None, :]
    pages = torch.gather(block_table.long(), 1, t // page)
    return pages, t % page


def _as4d(x):
    return x.unsqueeze(1) if x.dim() == 3 else x


def append_kv_ref(k, v, k_cache, v_cache, block_table, positions, k_scale=None, v_scale=None):
    """New caches (and scales) after the append; quantised caches come back in their dtype, so
    the test matrix compares them bit for bit.  Inputs are not modified."""
    k4, v4 = _as4d(k), _as4d(v)
    pages, slots = _slots(block_table, positions, k4.shape[1], k_cache.shape[1])
    outs, scales = [], []
    for x, cache, sc in ((k4, k_cache, k_scale), (v4, v_cache, v_scale)):
        cache = cache.clone()
        if cache.dtype in QMAX:
            q, s = quantize(x, cache.dtype)
            cache[pages, slots] = q
            sc = sc.clone()
            sc[pages, slots] = s.to(sc.dtype)
            scales.append(sc)
        else:
            cache[pages, slots] = x.to(cache.dtype)
        outs.append(cache)
    return tuple(outs + scales)


def append_kv_eager(k, v, k_cache, v_cache, block_table, positions, k_scale=None, v_scale=None):
    """Plain PyTorch: the same indexed writes (appending is exact; this is also the bench baseline)."""
    return append_kv_ref(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale)


# ---------------------------------------------------------------- reference backend kernel

def forward(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale):
    """In place: k, v (B, n, Hk, D); caches (NB, P, Hk, D); scales (NB, P, Hk) or None."""
    outs = append_kv_ref(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale)
    for dst, src in zip((k_cache, v_cache, k_scale, v_scale), outs):
        dst.copy_(src)


def backward(*args):
    raise NotImplementedError("append_kv has no gradient (inference only)")
