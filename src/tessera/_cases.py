"""Building blocks for op specs' test cases: random tensors in every layout.

A library module (the specs build their ``cases`` from it at import time), so ``import
tessera`` never imports :mod:`tessera.testing`; ``tessera.testing.cases`` re-exports it.

Layouts (the ``layout=`` of :func:`make`):

* ``contig``     -- plain contiguous tensor;
* ``rowslice``   -- rows of a wider buffer (row stride > last dim), as ``x.chunk(2, -1)`` gives;
* ``transposed`` -- last dim not unit-stride (a ``.t()`` view); kernels must copy or stride;
* ``broadcast``  -- one row expanded over all rows (row stride 0);
* ``offset``     -- contiguous data starting at a nonzero storage offset.

Data is random normal times ``scale`` (never zeros); seeds come from the case
name so failures reproduce, and ``TESSERA_SEED`` shifts them for fresh data.
"""
from __future__ import annotations

import hashlib
import os

import torch

from ._registry import Case

LAYOUTS = ("contig", "rowslice", "transposed", "broadcast", "offset")


def seed_for(name: str) -> int:
    base = int(os.environ.get("TESSERA_SEED", "0"))
    return (int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) + base) % (2**31)


def make(shape, dtype, device, gen, layout: str = "contig", scale: float = 1.0) -> torch.Tensor:
    shape = tuple(int(s) for s in shape)

    def rnd(*s):
        return (torch.randn(*s, generator=gen, dtype=torch.float64) * scale).to(dtype).to(device)

    if layout == "contig" or len(shape) == 0:
        return rnd(*shape)
    n = shape[-1]
    lead = shape[:-1]
    if layout == "rowslice":
        return rnd(*lead, 2 * n + 3)[..., 1:n + 1]
    if layout == "transposed":
        if len(shape) < 2:
            return rnd(2 * n)[::2]
        return rnd(*lead[:-1], n, lead[-1]).transpose(-1, -2)
    if layout == "broadcast":
        return rnd(*([1] * len(lead)), n).expand(*shape)
    if layout == "offset":
        numel = 1
        for s in shape:
            numel *= s
        return rnd(numel + 5)[5:].view(shape)
    raise ValueError(f"unknown layout {layout!r}")


def row_shapes(hidden_large: int = 4099) -> list[tuple[str, tuple, set]]:
    """The standard (name, shape, tags) sweep for row-wise ops (norms, softmax, GLUs)."""
    return [
        ("1x1", (1, 1), set()),
        ("7x7", (7, 7), set()),
        ("3x5x123", (3, 5, 123), set()),
        ("4x1025", (4, 1025), set()),
        ("2x3xH", (2, 3, hidden_large), {"large"}),
        ("130x256", (130, 256), set()),
        ("empty0x64", (0, 64), {"empty"}),
    ]


def standard_cases(build) -> list[Case]:
    """Cross ``build(name, shape, layout, tags) -> Case`` with the shape sweep and every layout."""
    cases = [build(name, shape, "contig", tags) for name, shape, tags in row_shapes()]
    for layout in LAYOUTS[1:]:
        cases.append(build(f"{layout}-5x3x123", (5, 3, 123), layout, {"layout"}))
    return cases


def frozen(tags) -> frozenset:
    return frozenset(tags)
