"""Test and benchmark cases of ``tessera.rope`` (the spec's ``cases`` / ``bench_cases``).

Each case builds q, k (random normal times ``scale``, in one of the layouts below), the
cos/sin tables from :func:`tessera.rope_cache` (fp32, or the input dtype with
``cs="input"``) and optionally position ids:

* layouts: ``contig``; ``qkv`` (q and k are head slices of one fused (B, S, Hq+2Hk, D)
  projection buffer); ``bhsd`` (q, k are (B, H, S, D) tensors transposed to (B, S, H, D));
  ``packed`` (3-D varlen (tokens, H, D) with per-sequence positions);
* position ids: None (arange), ``random`` (B, S) int64, ``repeated`` int32 (every id
  twice, and one id everywhere in the first row), ``descending`` (S,) int64 broadcast,
  ``row`` (1, S) int32.

Cases that pass ``position_ids`` are tagged ``layout`` (with the view layouts): the generic
bad-input test breaks every tensor argument of the smallest untagged case into int32,
which is a valid dtype for ids, so the ids' own errors are tested in tests/test_rope.py.
"""
from __future__ import annotations

import torch

from ..._registry import Case
from .cache import rope_cache



def _qk(B, S, Hq, Hk, D, dtype, device, gen, layout, scale, clamp):
    def rnd(*shape):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale
        if clamp:
            t = t.clamp(-clamp, clamp)
        return t.to(dtype).to(device)

    if layout == "qkv":
        buf = rnd(B, S, Hq + 2 * Hk, D)
        return buf[:, :, :Hq], buf[:, :, Hq:Hq + Hk]
    if layout == "bhsd":
        return rnd(B, Hq, S, D).transpose(1, 2), rnd(B, Hk, S, D).transpose(1, 2)
    if layout == "packed":
        return rnd(B * S, Hq, D), rnd(B * S, Hk, D)
    return rnd(B, S, Hq, D), rnd(B, S, Hk, D)


def _positions(kind, B, S, P, gen, device):
    if kind is None:
        return None
    if kind == "random":
        return torch.randint(0, P, (B, S), generator=gen, dtype=torch.int64).to(device)
    if kind == "repeated":
        ids = (torch.arange(B * S, dtype=torch.int32) // 2 % P).view(B, S)
        ids[0] = min(3, P - 1)
        return ids.to(device)
    if kind == "descending":
        return torch.arange(S - 1, -1, -1, dtype=torch.int64).to(device)
    if kind == "row":
        return (torch.arange(S, dtype=torch.int32) + 5).view(1, S).to(device)
    if kind == "varlen":  # packed sequences of lengths 5, 11, 7, ...: positions restart per sequence
        lens, ids, left = [5, 11, 7], [], B * S
        while left > 0:
            n = min(lens[len(ids) % 3], left)
            ids.append(torch.arange(n, dtype=torch.int64))
            left -= n
        return torch.cat(ids).to(device)
    raise ValueError(kind)


def build(name, B, S, Hq, Hk, D, *, r=None, interleaved=False, pos=None, layout="contig", cs="fp32",
          scale=1.0, clamp=None, P=None, tags=()):
    """A Case; ``r`` = rotary_dim (None: head_dim, passed as None); P = table rows (default
    seq + 9: small tables keep the cases within the opcheck/compile tests' size limits)."""
    P = S + 9 if P is None else P
    tags = set(tags) | ({"layout"} if (pos is not None or layout != "contig") else set())

    def mk(dtype, device, gen):
        q, k = _qk(B, S, Hq, Hk, D, dtype, device, gen, layout, scale, clamp)
        cos, sin = rope_cache(P, r or D, dtype=dtype if cs == "input" else torch.float32, device=device)
        kw = {"q": q, "k": k, "cos": cos, "sin": sin}
        ids = _positions(pos, B, S, P, gen, device)
        if ids is not None and layout == "packed":
            ids = ids.reshape(-1)
        if ids is not None:
            kw["position_ids"] = ids
        if interleaved:
            kw["interleaved"] = True
        if r is not None:
            kw["rotary_dim"] = r
        return kw

    return Case(name, mk, frozenset(tags))


def cases():
    return [
        # token counts 1, 7, 17, 129; head dims 64, 80, 96, 128; GQA / MQA head counts
        build("3tok-hd32", 1, 3, 2, 1, 32),
        build("1tok-hd64-pos5", 1, 1, 4, 4, 64, pos="row"),  # (position 0 alone would be the identity)
        build("7tok-hd80-gqa", 1, 7, 8, 2, 80),
        build("17tok-hd96-mqa", 1, 17, 3, 1, 96),
        build("2x129tok-hd128-gqa", 2, 129, 4, 2, 128),
        build("3x7-hd64-interleaved", 3, 7, 2, 2, 64, interleaved=True),
        build("2x17-hd80-interleaved-gqa", 2, 17, 4, 1, 80, interleaved=True),
        # partial rotary: odd-ish head dims, pass-through features
        build("2x17-hd72-r32", 2, 17, 2, 2, 72, r=32),
        build("7tok-hd96-r64-interleaved", 1, 7, 3, 1, 96, r=64, interleaved=True),
        build("17tok-hd66-r2", 1, 17, 4, 2, 66, r=2),
        build("2x7-hd64-cs-input-dtype", 2, 7, 2, 2, 64, cs="input"),
        # explicit position ids
        build("2x17-pos-random", 2, 17, 4, 2, 64, pos="random"),
        build("2x17-pos-repeated-int32", 2, 17, 2, 2, 80, pos="repeated", interleaved=True),
        build("3x7-pos-descending-1d", 3, 7, 2, 1, 64, pos="descending"),
        build("2x9-pos-row-int32-r32", 2, 9, 2, 2, 48, r=32, pos="row"),
        build("packed-23tok-varlen", 1, 23, 4, 2, 64, pos="varlen", layout="packed"),
        build("packed-1tok", 1, 1, 2, 2, 64, pos="random", layout="packed"),
        # views: slices of a fused qkv projection, (B, H, S, D) transposes
        build("qkv-2x7-hd64-gqa", 2, 7, 4, 2, 64, layout="qkv"),
        build("qkv-1x17-hd96-r64-pos", 1, 17, 2, 1, 96, r=64, layout="qkv", pos="random"),
        build("bhsd-2x7-hd80", 2, 7, 2, 2, 80, layout="bhsd", interleaved=True),
        # empty batch / tokens
        build("empty-batch", 0, 7, 2, 2, 64, tags={"empty"}),
        build("empty-packed", 0, 1, 2, 2, 64, pos="random", layout="packed", tags={"empty"}),
        # magnitudes near the fp16 limit (outputs may overflow to inf exactly where the exact
        # result does); fp32 exercises the compensated rotation (error relative to |out|)
        build("large-magnitude", 2, 7, 2, 2, 64, scale=2e4, clamp=6e4, tags={"extreme"}),
        build("large-magnitude-interleaved-r32", 1, 9, 2, 1, 48, r=32, scale=2e4, clamp=6e4,
              interleaved=True, tags={"extreme"}),
        build("large-4x512-hd128-gqa", 4, 512, 8, 2, 128, P=1024, pos="random", tags={"large"}),
    ]


def bench_cases():
    return [build("llama-4096tok-32q8k-hd128", 1, 4096, 32, 8, 128, P=4096)]
