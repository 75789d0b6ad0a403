"""The cross-entropy op's test cases, roofline and benchmark cases.

Cases: vocabularies of 1, 7, 123, 1025, 4099 and 32003 (> one Triton block: the online
log-sum-exp across chunks) and 128256 (``large``); every reduction; ignored rows (some, all of
them: NaN mean and zero gradients; an ignore_index inside [0, V)); label smoothing, z-loss,
softcap and all three together; int32 targets; the per-row lse; the empty batch; logits that
are row slices, transposed, broadcast rows or at an offset; extreme logits (+-1e4, values near
the fp16 maximum with the target at the row max, -inf masked entries and a row where only the
target is finite).  The smallest case with >= 8 rows uses reduction="none", so the generic
checker's planted per-element errors land on a per-row output.
"""
from __future__ import annotations

import torch

from ..._registry import Case
from ... import _cases as C


def _targets(lead, V, gen, device, ignore_index=-100, ignored=0.0, int32=False):
    t = torch.randint(0, V, lead, generator=gen, dtype=torch.int64)
    if ignored > 0:
        t = torch.where(torch.rand(lead, generator=gen) < ignored, torch.full_like(t, ignore_index), t)
    return t.to(torch.int32 if int32 else torch.int64).to(device)


def _case(name, lead, V, tags=(), layout="contig", scale=1.0, ignored=0.0, int32=False, **opts):
    def mk(dtype, device, gen):
        logits = C.make((*lead, V), dtype, device, gen, layout, scale)
        target = _targets(tuple(lead), V, gen, device, opts.get("ignore_index", -100), ignored, int32)
        return {"logits": logits, "target": target, **opts}
    if layout != "contig":
        tags = set(tags) | {"layout"}
    return Case(name, mk, frozenset(tags))


def _all_ignored(reduction):
    def mk(dtype, device, gen):
        return {"logits": C.make((6, 33), dtype, device, gen), "target": torch.full((6,), -100, device=device),
                "reduction": reduction}
    return Case(f"all-ignored-{reduction}", mk, frozenset({"extreme"}))


def _near_fp16_max(dtype, device, gen):
    """Logits up to +-6e4: exp overflows unless shifted by the row max.  Rows 0-3 have their
    target at the row max (loss ~ log of the ties), so the mean stays inside fp16's range."""
    x = C.make((6, 77), dtype, device, gen, scale=2e4).clamp(-6e4, 6e4)
    x[0, 3] = 65504.0
    x[1] = -65504.0
    x[1, 7] = 65504.0
    x[2, :40] = 60000.0
    t = x.float().argmax(-1)
    t[4:] = torch.randint(0, 77, (2,), generator=gen)
    return {"logits": x, "target": t.to(device), "reduction": "mean"}


def _masked(dtype, device, gen):
    """-inf entries (fp32/fp16/bf16 all hold -inf): row 0 has a masked tail, row 1 only its
    target finite (loss 0, gradient 0), row 2 one -inf, row 3 is ignored and all -inf."""
    x = C.make((5, 300), dtype, device, gen)
    t = torch.randint(0, 100, (5,), generator=gen)
    x[0, 150:] = float("-inf")
    x[1] = float("-inf")
    x[1, t[1]] = 1.5
    x[2, (t[2] + 1) % 300] = float("-inf")
    x[3] = float("-inf")
    t[3] = -100
    return {"logits": x, "target": t.to(device), "reduction": "sum"}


def _masked_chunks(dtype, device, gen):
    """A first block entirely -inf (the online max must not start from it), over > 2 CPU blocks."""
    x = C.make((3, 5000), dtype, device, gen, scale=3.0) - 2e3
    x[:, :2500] = float("-inf")
    t = torch.randint(2500, 5000, (3,), generator=gen)
    return {"logits": x, "target": t.to(device), "reduction": "none"}


def cases():
    return [
        _case("1x1", (1,), 1),
        _case("9x7-none", (9,), 7, reduction="none"),
        _case("3x5x123", (3, 5), 123, ignored=0.3),
        _case("3x5x123-none", (3, 5), 123, reduction="none"),
        _case("4x1025-sum", (4,), 1025, reduction="sum"),
        _case("2x3x4099", (2, 3), 4099, ignored=0.2),
        _case("2x32003", (2,), 32003, reduction="none"),
        _case("130x256", (130,), 256, ignored=0.25),
        _case("large-3x128256", (3,), 128256, {"large"}, label_smoothing=0.1, z_loss=1e-4),
        _case("1d-123", (), 123, reduction="none"),
        _case("empty0x64", (0,), 64, {"empty"}),
        _case("empty0x64-none", (0,), 64, {"empty"}, reduction="none"),
        _case("empty0x64-sum", (0,), 64, {"empty"}, reduction="sum"),
        _case("rowslice-5x3x123", (5, 3), 123, layout="rowslice"),
        _case("transposed-5x3x123", (5, 3), 123, layout="transposed", reduction="none"),
        _case("broadcast-5x3x123", (5, 3), 123, layout="broadcast", reduction="sum"),
        _case("offset-5x3x123", (5, 3), 123, layout="offset", label_smoothing=0.1),
        _case("ignore-index-5-7x40", (7,), 40, ignored=0.4, ignore_index=5, reduction="none"),
        _case("int32-target-6x55", (6,), 55, int32=True, ignored=0.3),
        _case("smooth0.1-6x300", (6,), 300, ignored=0.2, label_smoothing=0.1),
        _case("smooth0.3-none-5x77", (5,), 77, label_smoothing=0.3, reduction="none"),
        _case("zloss-6x300", (6,), 300, z_loss=1e-2, scale=3.0),
        _case("zloss-none-5x77", (5,), 77, z_loss=1e-4, reduction="none"),
        _case("softcap30-6x300", (6,), 300, scale=20.0, softcap=30.0),
        _case("softcap5-none-5x77", (5,), 77, scale=4.0, softcap=5.0, reduction="none"),
        _case("all-options-4x3x1025", (4, 3), 1025, ignored=0.3, scale=10.0, label_smoothing=0.1, z_loss=1e-3,
              softcap=15.0),
        _case("all-options-none-2x5000", (2,), 5000, ignored=0.3, scale=10.0, label_smoothing=0.2, z_loss=1e-3,
              softcap=30.0, reduction="none"),
        _case("lse-5x3x123", (5, 3), 123, ignored=0.2, return_lse=True),
        _case("lse-softcap-none-4x300", (4,), 300, scale=10.0, softcap=20.0, reduction="none", return_lse=True),
        _all_ignored("mean"),
        _all_ignored("sum"),
        _case("logits-1e4-6x257", (6,), 257, {"extreme"}, scale=1e4, reduction="none"),
        _case("logits-1e4-mean-6x257", (6,), 257, {"extreme"}, scale=1e4, label_smoothing=0.1),
        Case("near-fp16-max-6x77", _near_fp16_max, frozenset({"extreme"})),
        Case("mask-5x300", _masked, frozenset({"extreme"})),
        Case("mask-first-block-3x5000", _masked_chunks, frozenset({"extreme"})),
    ]


def bytes_fwd(kw):
    """Read the logits once (the targets and the per-row outputs are O(rows))."""
    x = kw["logits"]
    return x.numel() * x.element_size()


def flops_fwd(kw):
    return 5 * kw["logits"].numel()


def bench_cases():
    return [_case("2048x32000", (2048,), 32000),
            _case("1024x128256", (1024,), 128256, {"extended"}),
            _case("1024x128256-zloss-softcap", (1024,), 128256, {"extended"}, scale=10.0, z_loss=1e-4,
                  softcap=30.0)]
