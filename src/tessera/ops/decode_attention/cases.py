"""Test and benchmark cases of decode_attention.

Every case fills the slots no sequence attends to (past seq_lens, outside the window, spare
pages) with NaN (float caches) or NaN scales (int8/fp8 caches): a kernel that reads them, even
with a zero weight, produces NaN and fails.  Block tables are shuffled permutations of pages.
"""
from __future__ import annotations

import torch

from ..._registry import Case
from ..append_kv.cases import block_table, random_cache

CACHE_VARIANTS = ("same", torch.float16, torch.bfloat16, torch.int8, torch.float8_e4m3fn)


def _poison(cache, scale, bt, seq_lens, window, P):
    keep = torch.zeros(cache.shape[0] * P, dtype=torch.bool)
    for b, n in enumerate(seq_lens):
        lo = max(0, n - window) if window > 0 else 0
        t = torch.arange(lo, n)
        keep[bt[b].long()[t // P] * P + t % P] = True
    drop = ~keep.view(cache.shape[0], P)
    if scale is not None:
        scale[drop] = float("nan")
    else:
        cache[drop] = float("nan")


def build(name, B, Hq, Hk, D, P, seq_lens, variant="same", window=-1, softcap=0.0, qscale=1.0, scale=None,
          tags=()):
    def mk(dtype, device, gen):
        cdt = dtype if variant == "same" else variant
        pages = max(1, -(-max(seq_lens) // P)) + 1
        nb, bt = block_table(B, pages, gen)
        caches = []
        for _ in range(2):
            c, s = random_cache((nb, P, Hk, D), cdt, gen, "cpu")
            _poison(c, s, bt, seq_lens, window, P)
            caches += [c.to(device), None if s is None else s.to(device)]
        q = torch.randn(B, Hq, D, generator=gen, dtype=torch.float64) * qscale
        kw = {"q": q.to(dtype).to(device), "k_cache": caches[0], "v_cache": caches[2], "block_table": bt.to(device),
              "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device), "scale": scale,
              "softcap": softcap, "window": window, "k_scale": caches[1], "v_scale": caches[3]}
        return kw
    suffix = "" if variant == "same" else "-" + str(variant).replace("torch.", "")
    return Case(name + suffix, mk, frozenset(tags))


_SHAPES = [
    # name, B, Hq, Hk, D, P, seq_lens, options
    ("b1-mha-d64-p16", 1, 2, 2, 64, 16, [17], {}),
    ("b3-gqa4-d128-p16", 3, 8, 2, 128, 16, [1, 100, 17], {}),
    ("b5-gqa4-d80-p1", 5, 4, 1, 80, 1, [0, 17, 1, 100, 33], {}),
    ("b3-window16", 3, 4, 1, 64, 16, [100, 17, 5], {"window": 16}),
    ("b3-softcap", 3, 4, 2, 64, 16, [40, 1, 23], {"softcap": 5.0, "qscale": 4.0}),
    ("b5-softcap-window-p1", 5, 4, 4, 64, 1, [0, 17, 1, 100, 33], {"softcap": 8.0, "window": 20, "qscale": 3.0}),
    ("b2-empty", 2, 4, 2, 64, 16, [0, 0], {}),
    ("b3-d72-scale", 3, 6, 3, 72, 16, [19, 64, 2], {"scale": 0.3}),
]


def cases():
    out = []
    for name, B, Hq, Hk, D, P, sl, opt in _SHAPES:
        out.append(build(name, B, Hq, Hk, D, P, sl, tags={"nograd"}, **opt))
    # untagged: the generic suites pick these (a tiny one for compile/export, a batch of 8 where every
    # tensor has >= 8 elements for the planted-bug checker)
    out.append(build("b2-tiny-d8-p4", 2, 2, 1, 8, 4, [3, 6]))
    out.append(build("b3-tiny-d16-p2", 3, 4, 2, 16, 2, [2, 5, 1]))
    out.append(build("b8-gqa2-d32-p16", 8, 4, 2, 32, 16, [0, 1, 17, 33, 5, 16, 2, 40]))
    for variant in CACHE_VARIANTS[1:]:
        for name, B, Hq, Hk, D, P, sl, opt in (_SHAPES[1], _SHAPES[2], _SHAPES[4]):
            out.append(build(name, B, Hq, Hk, D, P, sl, variant=variant, tags={"nograd"}, **opt))
        # every cache dtype in a tiny case too (a few hundred elements: what the Oclgrind run can afford)
        out.append(build("b2-tiny-d12-p4-gqa3-window", 2, 3, 1, 12, 4, [3, 6], variant=variant, window=5,
                         softcap=3.0, tags={"nograd"}))
    # a longer context with several splits per (sequence, kv head) on the CPU backend
    out.append(build("b2-long-1500", 2, 8, 2, 128, 16, [1500, 777], tags={"nograd", "large"}))
    out.append(build("b2-long-1500", 2, 8, 2, 128, 16, [1500, 777], variant=torch.int8, tags={"nograd", "large"}))
    out.append(build("near-fp16-max-q", 2, 4, 2, 64, 16, [30, 9], qscale=3e3, tags={"nograd", "extreme"}))
    # D = 112: the int8 P.V's last 64-dim pass has a half-masked second block; odd key counts
    for variant in ("same", torch.int8):
        out.append(build("b2-gqa4-d112", 2, 8, 2, 112, 16, [77, 33], variant=variant, tags={"nograd"}))
    return out


def bench_cases():
    out = []
    for variant in ("same", torch.int8):
        for B, ctx, tags in ((1, 16384, ()), (16, 1024, ()), (1, 1024, ("extended",)), (4, 4096, ("extended",)),
                             (16, 4096, ("extended",))):
            # KV bytes: B * ctx * 8 heads * 128 * 2 (K, V) * elsize: 64 MiB in bf16 (16 x 16384 =
            # 1 GiB would make the eager gather + SDPA baseline take minutes per row); the rest of
            # the grid (batch 1-16 x ctx 1K-16K) runs with `tessera bench --extended`
            out.append(build(f"b{B}-ctx{ctx}-hq32-hk8-d128-p16", B, 32, 8, 128, 16, [ctx] * B, variant=variant,
                             tags=set(tags)))
    return out
