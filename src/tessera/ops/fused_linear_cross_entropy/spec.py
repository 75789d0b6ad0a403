"""The fused linear cross-entropy's test cases, roofline and benchmark cases.

Cases are small (the float64 reference holds the full logits; the Triton interpreter runs the
chunk loop): vocabularies 1, 11, 123, 1025, 4099 (and 32003, ``large``), hidden sizes 8-64,
token counts 1-130 with leading dims; with and without bias; every reduction; ignored
targets (some, all); label smoothing, z-loss and softcap; int32 targets; hidden as a row slice
or a transposed view and a transposed weight; no tokens; logits of ~+-1e4.  Chunk boundaries
(tokens not a multiple of the chunk) are forced with ``TESSERA_FLCE_CHUNK_BYTES`` in
tests/test_fused_linear_cross_entropy.py, which also fuzzes the op.
"""
from __future__ import annotations

import torch

from ..._registry import Case
from ... import _cases as C
from ..cross_entropy.spec import _targets

# dweight / dbias sum over every token and dhidden over the vocabulary: fp32 error grows like
# sqrt(terms) * eps * |terms| (4099 x 64 here), so atol scales like the matmul rule of numerics.md
FP32_GRAD_TOL = {}


def _case(name, lead, H, V, tags=(), bias=True, layout="contig", w_layout="contig", scale=1.0, ignored=0.0,
          int32=False, **opts):
    def mk(dtype, device, gen):
        kw = {"hidden": C.make((*lead, H), dtype, device, gen, layout, scale),
              "weight": C.make((V, H), dtype, device, gen, w_layout, 1.0 / H ** 0.5),
              "target": _targets(tuple(lead), V, gen, device, opts.get("ignore_index", -100), ignored, int32)}
        kw["bias"] = C.make((V,), dtype, device, gen) if bias else None
        return {**kw, **opts}
    if layout != "contig" or w_layout != "contig":
        tags = set(tags) | {"layout"}
    return Case(name, mk, frozenset(tags))


def cases():
    return [
        _case("t1-h8-v1", (1,), 8, 1),
        _case("t9-h16-v11-none", (9,), 16, 11, reduction="none"),
        _case("t12-h16-v13-none", (12,), 16, 13, reduction="none", bias=False),
        _case("t2x5-h32-v123", (2, 5), 32, 123, ignored=0.3),
        _case("t33-h24-v1025-sum", (33,), 24, 1025, reduction="sum", bias=False),
        _case("t7-h16-v4099", (7,), 16, 4099, ignored=0.2),
        _case("t130-h16-v64", (130,), 16, 64, ignored=0.25),
        _case("t64-h64-v32003", (64,), 64, 32003, {"large"}, label_smoothing=0.1, z_loss=1e-4),
        _case("t0-h16-v33", (0,), 16, 33, {"empty"}),
        _case("t0-h16-v33-sum", (0,), 16, 33, {"empty"}, reduction="sum"),
        _case("rowslice-t3x5-h24-v77", (3, 5), 24, 77, layout="rowslice"),
        _case("transposed-t5x3-h24-v77", (5, 3), 24, 77, layout="transposed", reduction="none"),
        _case("weight-transposed-t8-h24-v77", (8,), 24, 77, w_layout="transposed"),
        _case("int32-t10-h16-v50", (10,), 16, 50, int32=True, ignored=0.3),
        _case("smooth0.1-t16-h16-v300", (16,), 16, 300, ignored=0.2, label_smoothing=0.1),
        _case("zloss-t16-h16-v300", (16,), 16, 300, scale=3.0, z_loss=1e-2),
        _case("softcap30-none-t10-h16-v300", (10,), 16, 300, scale=10.0, softcap=30.0, reduction="none"),
        _case("all-options-t4x6-h32-v513", (4, 6), 32, 513, ignored=0.3, scale=5.0, label_smoothing=0.1,
              z_loss=1e-3, softcap=15.0, ignore_index=3),
        _case("all-ignored-t6-h16-v33", (6,), 16, 33, {"extreme"}, ignored=1.0),
        _case("logits-1e4-t8-h16-v257", (8,), 16, 257, {"extreme"}, scale=2500.0, reduction="none"),
    ]


def bytes_fwd(kw):
    """hidden, weight (and bias) read: the logits never reach DRAM as a whole."""
    return sum(t.numel() * t.element_size() for t in (kw["hidden"], kw["weight"], kw.get("bias")) if t is not None)


def flops_fwd(kw):
    h, w = kw["hidden"], kw["weight"]
    T, V = h.numel() // h.shape[-1], w.shape[0]
    return 2 * T * h.shape[-1] * V + 5 * T * V


def compute_dtype(kw):
    return {torch.bfloat16: "bf16"}.get(kw["hidden"].dtype, "fp32")


def bench_cases():
    return [_case("512x1024x32000", (512,), 1024, 32000, bias=False),
            _case("8192x2048x128256", (8192,), 2048, 128256, {"extended"}, bias=False)]
