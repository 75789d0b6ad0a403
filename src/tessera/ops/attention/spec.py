"""The attention op's spec: test cases, roofline (FLOPs/bytes) and benchmark cases.

Cases are small (the float64 reference and the Triton interpreter run them): sequence lengths
1, 17, 129 (and 1000, tagged ``large``); Lq != Lk with causal (Lq > Lk gives fully masked top
rows); GQA 4:1 and MQA; head_dim 40, 64, 80, 96, 128; windows; softcap; varlen with an empty
sequence; q/k/v as views of a fused qkv tensor and transposed views; Lk = 0 and an empty batch;
scores of +-1e4 (and +-3e4, near the fp16 limit in the baseline).
"""
from __future__ import annotations

import torch

from ..._registry import Case, OpSpec, bf16_compute_if
from ... import _cases as C
from .ref import window_bounds

HEADS_Q, HEADS_K = 4, 2


def _case(name, B, Lq, Lk, Hq, Hk, D, tags=(), layout="contig", amp=1.0, lens=None, v_amp=1.0, **opts):
    """``lens`` = (q lengths, k lengths) builds a packed varlen case (tagged ``layout``); ``amp``
    scales q and k (scores grow as amp^2), ``v_amp`` scales v."""
    def mk(dtype, device, gen):
        if lens is not None:
            Tq, Tk = sum(lens[0]), sum(lens[1])
            q = C.make((Tq, Hq, D), dtype, device, gen, scale=amp)
            k = C.make((Tk, Hk, D), dtype, device, gen, scale=amp)
            v = C.make((Tk, Hk, D), dtype, device, gen)
            cq = torch.tensor([0] + list(lens[0]), dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
            ck = torch.tensor([0] + list(lens[1]), dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
            return {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck, **opts}
        if layout == "qkv":      # views of one fused projection output (B, S, Hq + 2 Hk, D)
            qkv = C.make((B, Lq, Hq + 2 * Hk, D), dtype, device, gen)
            q, k, v = qkv[:, :, :Hq], qkv[:, :, Hq:Hq + Hk], qkv[:, :, Hq + Hk:]
            return {"q": q, "k": k, "v": v, **opts}
        if layout == "transposed":  # (B, H, S, D) buffers seen as (B, S, H, D)
            q = C.make((B, Hq, Lq, D), dtype, device, gen, scale=amp).transpose(1, 2)
            k = C.make((B, Hk, Lk, D), dtype, device, gen, scale=amp).transpose(1, 2)
            v = C.make((B, Hk, Lk, D), dtype, device, gen).transpose(1, 2)
            return {"q": q, "k": k, "v": v, **opts}
        return {"q": C.make((B, Lq, Hq, D), dtype, device, gen, scale=amp),
                "k": C.make((B, Lk, Hk, D), dtype, device, gen, scale=amp),
                "v": C.make((B, Lk, Hk, D), dtype, device, gen, scale=v_amp), **opts}
    if lens is not None or layout != "contig":
        tags = set(tags) | {"layout"}
    return Case(name, mk, frozenset(tags))


def _cases():
    H, K = HEADS_Q, HEADS_K
    return [
        _case("s17-d64", 2, 17, 17, H, K, 64),
        _case("s1-d64", 2, 1, 1, H, H, 64),
        _case("s17-causal-lse", 2, 17, 17, H, H, 64, causal=True, return_lse=True),
        _case("s129-causal-d64", 1, 129, 129, 2, 2, 64, causal=True),
        _case("s129-d64", 1, 129, 129, 2, 1, 64),
        _case("s1000-causal-gqa", 1, 1000, 1000, 4, 2, 64, tags={"large"}, causal=True),
        _case("q17-k40-causal", 2, 17, 40, H, K, 64, causal=True, return_lse=True),
        _case("q40-k17-causal-masked-rows", 1, 40, 17, H, K, 64, causal=True, return_lse=True),
        _case("q1-k33-causal", 3, 1, 33, H, K, 64, causal=True),
        _case("gqa4-s33-causal", 2, 33, 33, 8, 2, 64, causal=True),
        _case("mqa-s33", 2, 33, 33, 4, 1, 64),
        _case("d40-s33", 1, 33, 33, H, K, 40, causal=True),
        _case("d80-s33", 1, 33, 33, H, K, 80),
        _case("d96-s33", 1, 33, 33, H, K, 96, causal=True),
        _case("d128-s33", 1, 33, 33, H, K, 128),
        _case("d256-s20", 1, 20, 20, 2, 1, 256, causal=True),
        _case("d7-s9", 2, 9, 9, 2, 2, 7),
        # tiny masked / GQA / varlen cases (a few hundred elements: what the Oclgrind run can afford)
        _case("tiny-d5-window-softcap-gqa", 1, 9, 11, 4, 2, 5, causal=True, window=(3, 1), softcap=3.0),
        _case("tiny-varlen-d6-causal", 0, 0, 0, 2, 1, 6, lens=((3, 0, 5), (2, 4, 6)), causal=True, return_lse=True),
        _case("window8-0-s65", 1, 65, 65, H, K, 64, window=(8, 0)),
        _case("window4-4-s65", 1, 65, 65, H, K, 64, window=(4, 4), return_lse=True),
        _case("window-causal-q20-k50", 1, 20, 50, H, K, 64, causal=True, window=(6, -1)),
        _case("softcap30-s33", 1, 33, 33, H, K, 64, amp=3.0, softcap=30.0, causal=True),
        _case("softcap5-window", 1, 33, 40, H, K, 64, amp=2.0, softcap=5.0, window=(10, 3), return_lse=True),
        _case("scale0.3-s17", 1, 17, 17, H, K, 32, scale=0.3),
        _case("varlen-empty-seq-causal", 0, 0, 0, H, K, 64, lens=((5, 0, 17, 33), (5, 0, 17, 33)), causal=True,
              return_lse=True),
        _case("varlen-q-ne-k", 0, 0, 0, H, K, 64, lens=((3, 7, 0, 12), (9, 4, 6, 0))),
        _case("varlen-causal-q-ne-k", 0, 0, 0, 8, 2, 64, lens=((3, 70, 1), (9, 40, 66)), causal=True),
        _case("qkv-views-s19", 2, 19, 19, H, K, 64, layout="qkv", causal=True),
        _case("transposed-s17", 2, 17, 23, H, K, 64, layout="transposed"),
        _case("lk0-masked", 2, 5, 0, H, K, 64, tags={"empty"}, return_lse=True),
        _case("empty-batch", 0, 17, 17, H, K, 64, tags={"empty"}),
        # scores reach ~+-1e4 (q, k ~ N(0, 60^2), D = 64, scale 1/8: std(s) = 3600; +-3e4 with 100^2, near
        # the fp16 limit in the fp16 baseline): one-hot rows.  Their exact dq/dk are ~1e-13, and what any
        # fp32 implementation returns is the rounding of dS = P (dP - D) ~ eps |dout| |v| sqrt(D), amplified
        # by scale |k| ~ 10^3 (SDPA fp32: 7e-5 .. 2e-4); v ~ N(0, 0.01^2) keeps that floor at ~1e-6 so the
        # fp32 gradients stay checked at the default tolerance (dv = P^T dout is O(1) and checked fully).
        _case("logits-1e4", 1, 33, 33, H, K, 64, tags={"extreme"}, amp=60.0, v_amp=0.01, return_lse=True),
        _case("logits-3e4-causal", 1, 17, 17, H, K, 64, tags={"extreme"}, amp=100.0, v_amp=0.01, causal=True),
    ]


def _seq_lens(kw):
    q, k = kw["q"], kw["k"]
    if kw.get("cu_seqlens_q") is not None:
        cq, ck = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_k"].tolist()
        return [(int(b - a), int(d - c)) for a, b, c, d in zip(cq, cq[1:], ck, ck[1:])]
    return [(q.shape[1], k.shape[1])] * q.shape[0]


def allowed_pairs(Lq: int, Lk: int, wl: int, wr: int) -> int:
    """Number of allowed (i, j) score entries of one sequence (bottom-right aligned window)."""
    if Lq == 0 or Lk == 0:
        return 0
    i = torch.arange(Lq, dtype=torch.int64) + (Lk - Lq)
    lo = (i - wl).clamp(min=0) if wl >= 0 else torch.zeros_like(i)
    hi = (i + wr).clamp(max=Lk - 1) if wr >= 0 else torch.full_like(i, Lk - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


def _flops_fwd(kw):
    wl, wr = window_bounds(kw.get("causal", False), kw.get("window", (-1, -1)))
    q = kw["q"]
    pairs = sum(allowed_pairs(a, b, wl, wr) for a, b in _seq_lens(kw))
    return 4 * q.shape[-1] * q.shape[-2] * pairs


def _nbytes(t):
    return t.numel() * t.element_size()


def _bytes_fwd(kw):
    q = kw["q"]
    return 2 * _nbytes(q) + _nbytes(kw["k"]) + _nbytes(kw["v"]) + 4 * q.numel() // q.shape[-1]


def _bytes_bwd(kw):
    q = kw["q"]  # read q, k, v, out, dout, lse; write dq, dk, dv
    return 4 * _nbytes(q) + 2 * (_nbytes(kw["k"]) + _nbytes(kw["v"])) + 4 * q.numel() // q.shape[-1]


def _bench_cases():
    """Batch 1 at seq 1024/2048 by default; ``tessera bench --extended`` adds the rest of the
    issue's grid (batch 1-4 x seq 512-4096, several seconds per call on 2 cores)."""
    main = [(1, 1024), (1, 2048)]
    more = [(1, 512), (1, 4096), (2, 1024), (2, 2048), (4, 512), (4, 1024)]
    return ([_case(f"prefill-b{b}-s{s}-h32kv8-d128-causal", b, s, s, 32, 8, 128, causal=True) for b, s in main]
            + [_case(f"prefill-b{b}-s{s}-h32kv8-d128-causal", b, s, s, 32, 8, 128, tags=("extended",), causal=True)
               for b, s in more])


def build_spec(fn, ref, eager):
    return OpSpec(
        name="attention", fn=fn, ref=ref, eager=eager,
        kernels={"reference": "tessera.ops.attention.ref", "cpu": "tessera.ops.attention.cpu",
                 "triton": "tessera.ops.attention.triton", "opencl": "tessera.ops.attention.opencl",
                 "cpu:aarch64": "tessera.ops.attention.cross", "cpu:riscv64": "tessera.ops.attention.cross"},
        cases=_cases(), grad_inputs=("q", "k", "v"),
        bytes_fwd=_bytes_fwd, bytes_bwd=_bytes_bwd,
        flops_fwd=_flops_fwd, flops_bwd=lambda kw: int(2.5 * _flops_fwd(kw)),
        bound="compute", bench_cases=_bench_cases(),
        # bf16 takes Q K^T with VDPBF16PS (attn_tiles.c): its ceiling is the bf16 peak
        compute_dtype=bf16_compute_if("q"),
        out_dtypes={1: torch.float32},
        # q/k/v are (batch, seq, heads, head_dim) or packed varlen + cu_seqlens: the generic row fuzz
        # cannot build them; random_case() below drives a hypothesis test in this file instead
        fuzz="test_attention_fuzz.py",
        # fp32 gradients: dq sums Lk terms (dk, dv sum Lq terms) of dS = P (dP - D), each dP itself a
        # D-long fp32 dot product: rounding grows ~ eps * sqrt(L * D) * |term|; with L * D up to
        # 1000 * 64 (2^16, sqrt = 256) that is ~1.5e-5 |term| -- atol 3e-5 (|terms| <= 2 in the cases;
        # SDPA fp32 itself reaches 7e-6 on the softcap case, and this kernel 1.2e-5).
        fp32_grad_tol={"q": (1.3e-6, 3e-5), "k": (1.3e-6, 3e-5), "v": (1.3e-6, 3e-5)},
    )


def random_case(seed: int) -> Case:
    """A random attention case for property-based testing (the generic fuzzer in tests/test_fuzz.py
    draws 1-3-D shapes, which attention rejects): batch 0-3 or varlen with empty sequences, Lq/Lk
    0-140, GQA ratios 1-4, head_dim 1-160, causal/window/softcap/scale options, fused-qkv and
    transposed layouts.  ``random_case(i)`` is deterministic in i."""
    g = torch.Generator().manual_seed(seed)

    def ri(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    Hk, G, D = ri(1, 3), ri(1, 4), ri(1, 160)
    opts = {}
    if ri(0, 1):
        opts["causal"] = True
    if ri(0, 2) == 0:
        opts["window"] = (ri(-1, 40), ri(-1, 40))
    if ri(0, 3) == 0:
        opts["softcap"] = float(ri(2, 40))
    if ri(0, 3) == 0:   # scores stay O(1..10): larger logits are the extreme cases' business (fp32 rounding
        opts["scale"] = ri(10, 200) / 100 / D ** 0.5   # of s ~ eps |s| moves out by as much in any fp32 code)
    opts["return_lse"] = bool(ri(0, 1))
    kind = ri(0, 3)
    if kind == 0:
        nb = ri(1, 4)
        lens = (tuple(ri(0, 70) for _ in range(nb)), tuple(ri(0, 70) for _ in range(nb)))
        return _case(f"fuzz{seed}-varlen", 0, 0, 0, Hk * G, Hk, D, lens=lens, amp=1.5, **opts)
    B, Lq = ri(0, 3), ri(1, 140)
    Lk = Lq if kind == 1 else ri(0, 140)
    layout = "qkv" if kind == 1 else ("transposed" if kind == 2 else "contig")
    return _case(f"fuzz{seed}-{layout}-B{B}-q{Lq}-k{Lk}-h{Hk * G}/{Hk}-d{D}", B, Lq, Lk, Hk * G, Hk, D,
                 layout=layout, amp=1.5, **opts)
