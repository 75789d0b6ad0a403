"""Test/benchmark cases of append_kv, and the paged-cache builders decode_attention's cases share.

Caches start full of stale random data (so a write to the wrong slot, or a missing one, is
seen); block tables are random permutations of the pages (non-sequential), with spare pages
that no sequence owns.
"""
from __future__ import annotations

import torch

from ... import memory
from ..._registry import Case
from .ref import QMAX, quantize


def block_table(B, pages_per_seq, gen, spare=3):
    """(num_blocks, int32 table (B, pages_per_seq)) with shuffled, distinct pages."""
    nb = B * pages_per_seq + spare
    perm = torch.randperm(nb, generator=gen)[:B * pages_per_seq]
    return nb, perm.view(B, pages_per_seq).to(torch.int32)


def random_cache(shape, cache_dtype, gen, device):
    """(cache, scale or None): random N(0,1) data, quantised per (token, head) for int8/fp8.
    Allocated like ``tessera.alloc_kv_cache`` (huge pages on the CPU when >= 2 MiB), as a
    serving engine should allocate its cache."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    q, s = quantize(x, cache_dtype) if cache_dtype in QMAX else (x.to(cache_dtype), None)
    cache = memory.zeros(q.shape, q.dtype, device=device).copy_(q)
    return cache, None if s is None else memory.zeros(s.shape, s.dtype, device=device).copy_(s)


def _cache_dt(variant, dtype):
    return dtype if variant == "same" else variant


def _build(name, B, n_new, Hk, D, P, positions, variant="same", special=False, tags=()):
    def mk(dtype, device, gen):
        cdt = _cache_dt(variant, dtype)
        n = n_new or 1
        cap = max(positions) + n
        pages = -(-cap // P) + 1
        nb, bt = block_table(B, pages, gen)
        kc, ks = random_cache((nb, P, Hk, D), cdt, gen, device)
        vc, vs = random_cache((nb, P, Hk, D), cdt, gen, device)
        shape = (B, Hk, D) if n_new is None else (B, n_new, Hk, D)
        k = torch.randn(*shape, generator=gen, dtype=torch.float64)
        v = torch.randn(*shape, generator=gen, dtype=torch.float64) * 3
        if special:  # NaN entries, an all-zero vector, a huge vector, exact ties of x / scale
            k4 = k.view(B, -1, Hk, D)
            k4[0, 0, 0, :3] = float("nan")
            k4[0, 0, -1] = 0.0
            k4[-1, -1, 0] = 1e4
            k4[-1, 0, -1] = torch.arange(D, dtype=torch.float64) - D / 2  # halves when amax = 127/2 ...
        return {"k": k.to(dtype).to(device), "v": v.to(dtype).to(device), "k_cache": kc, "v_cache": vc,
                "block_table": bt.to(device), "positions": torch.tensor(positions, dtype=torch.int32, device=device),
                "k_scale": ks, "v_scale": vs}
    suffix = "" if variant == "same" else "-" + str(variant).replace("torch.", "")
    return Case(name + suffix, mk, frozenset(tags))


def _shapes():
    return [("b3-1tok-p16-d64", 3, None, 2, 64, 16, [0, 17, 31]),
            ("b5-n7-p1-d80", 5, 7, 1, 80, 1, [0, 3, 9, 1, 20]),
            ("b1-n20-p16-d128", 1, 20, 4, 128, 16, [10]),
            ("b2-n3-p64-d64", 2, 3, 2, 64, 64, [62, 0])]


def cases(quantised: bool):
    """Float caches in k's dtype (quantised=False), or int8/fp8 caches (quantised=True)."""
    if not quantised:
        out = [_build(*s, tags={"nograd"}) for s in _shapes()]
        # untagged: the generic suites pick these (a tiny one for compile/export, a batch of 8 where
        # every tensor has >= 8 elements for the planted-bug checker)
        out += [_build("b2-tiny-d8-p4", 2, None, 1, 8, 4, [1, 6]),
                _build("b3-tiny-d16-p2", 3, None, 2, 16, 2, [0, 3, 2]),
                _build("b8-n2-p16-d32", 8, 2, 2, 32, 16, [0, 17, 31, 5, 14, 1, 40, 2])]
        out.append(_build("special", 2, 2, 2, 64, 16, [5, 15], special=True, tags={"extreme", "nograd"}))
        return out
    out = []
    for fmt in QMAX:
        out += [_build(*s, variant=fmt, tags={"nograd"}) for s in _shapes()]
        # a tiny one too (a few hundred elements: what the Oclgrind run can afford)
        out.append(_build("b2-n3-tiny-d12-p4", 2, 3, 1, 12, 4, [1, 6], variant=fmt, tags={"nograd"}))
        out.append(_build("special", 2, 2, 2, 64, 16, [5, 15], variant=fmt, special=True, tags={"extreme", "nograd"}))
    return out


def bench_cases():
    out = []
    for fmt in ("same", torch.int8):
        # one decode step for 16 sequences: 16 x 8 heads x 128
        out.append(_build("b16-1tok-h8-d128", 16, None, 8, 128, 16, list(range(0, 16 * 97, 97)), variant=fmt))
        # a prefill chunk: 2048 tokens
        out.append(_build("b1-n2048-h8-d128", 1, 2048, 8, 128, 16, [64], variant=fmt))
    return out
