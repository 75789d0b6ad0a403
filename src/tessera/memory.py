"""Host memory for big, long-lived buffers: paged KV caches in transparent huge pages.

Why: a decode step reads its KV cache page by page through a block table, so consecutive reads
land far apart in memory.  With 4 KiB pages, a 64 MiB cache spans 16384 of them, four times the
~3000 4 KiB entries of Zen 4's second-level data TLB (and in a VM each TLB miss walks two
page tables).  Backing the cache with 2 MiB pages removes most of those walks.  Measured on the
2-core Zen 4 VM, same process, same data, alternating (``benchmarks/results/2026-12-03g-cpu/
hugepages-ab``): decode over shuffled 16-token pages 0.98-1.16x faster (median 1.06x int8 KV,
1.08x bf16 KV), a plain read of the same pages 1.00-1.15x, while a linear read pass gains
nothing (its prefetcher already hides the walks).

How: an anonymous private ``mmap`` (zero-filled by the kernel, no write pass needed), advised
``MADV_HUGEPAGE`` before anything touches it, viewed as a tensor from its 2 MiB-aligned start
(``torch.frombuffer`` keeps the mapping alive; it is unmapped when the last view dies).  The
advice needs transparent huge pages in ``always`` or ``madvise`` mode
(``/sys/kernel/mm/transparent_hugepage/enabled``); the kernel then backs the region with huge
pages on first touch when it has them free, and with 4 KiB pages otherwise: never an error.
Buffers under 2 MiB, other devices, other OSes or ``huge_pages=False`` get ``torch.zeros``.

PyTorch's own switch, ``THP_MEM_ALLOC_ENABLE=1``, does this for every allocation >= 2 MiB of a
process, but it is read once at start-up and also reaches tensors that never benefit.
"""
from __future__ import annotations

import math
import mmap
import sys
from pathlib import Path

import torch

from . import _checks

HUGE_PAGE = 2 << 20
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_mode() -> str:
    """The host's transparent-huge-page mode: ``always``, ``madvise``, ``never``, or
    ``unavailable`` (not Linux, or no THP support)."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return "unavailable"
    try:
        text = _THP.read_text()
    except OSError:
        return "unavailable"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "unavailable"


def _dtype_arg(fn, dtype):
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"tessera.{fn}: argument 'dtype' ({dtype!r}) must be a torch.dtype")


def zeros(shape, dtype: torch.dtype, *, device="cpu", huge_pages: bool = True) -> torch.Tensor:
    """A zero-filled contiguous tensor; on the CPU, when it is >= 2 MiB and ``huge_pages``, in
    memory advised for transparent huge pages (see the module docstring)."""
    _dtype_arg("memory.zeros", dtype)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"tessera.memory.zeros: argument 'shape' ({shape!r}) must be a sequence of ints") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"tessera.memory.zeros: argument 'shape' {shape} must not have negative sizes")
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if (device.type != "cpu" or not huge_pages or nbytes < HUGE_PAGE
            or huge_pages_mode() not in ("always", "madvise")):
        return torch.zeros(shape, dtype=dtype, device=device)
    # one spare huge page so the tensor can start on a 2 MiB boundary: every 2 MiB of it can then
    # be one huge page (a region is only backed by huge pages where it covers aligned 2 MiB)
    mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(mm, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start:start + nbytes].view(dtype).view(shape)


def alloc_kv_cache(num_blocks: int, page_size: int, num_kv_heads: int, head_dim: int,
                   dtype: torch.dtype = torch.bfloat16, *, device="cpu", huge_pages: bool = True):
    """Zero-filled paged caches for ``tessera.append_kv`` / ``tessera.decode_attention``.

    Returns ``(k_cache, v_cache, k_scale, v_scale)``: caches of shape (num_blocks, page_size,
    num_kv_heads, head_dim) in ``dtype`` (fp32/fp16/bf16, or int8 / float8_e4m3fn with float32
    scales of shape (num_blocks, page_size, num_kv_heads); the scales are None for float
    caches).  On the CPU the caches live in transparent huge pages when the host allows it
    (``huge_pages=False`` opts out); see this module's docstring for why and what it buys.
    """
    from .ops.append_kv.ref import CACHE_DTYPES, QMAX
    _dtype_arg("alloc_kv_cache", dtype)
    _checks.choice("alloc_kv_cache", "dtype", dtype, CACHE_DTYPES)
    sizes = {"num_blocks": num_blocks, "page_size": page_size, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"tessera.alloc_kv_cache: argument '{name}' ({n!r}) must be an int >= 1")
    shape = (num_blocks, page_size, num_kv_heads, head_dim)
    k_cache, v_cache = (zeros(shape, dtype, device=device, huge_pages=huge_pages) for _ in range(2))
    if dtype not in QMAX:
        return k_cache, v_cache, None, None
    k_scale, v_scale = (zeros(shape[:3], torch.float32, device=device, huge_pages=huge_pages) for _ in range(2))
    return k_cache, v_cache, k_scale, v_scale
