"""Paged decode attention: one new query token per sequence against a paged KV cache
(``tessera.decode_attention``), with GQA, sliding window, softcap and int8/fp8 caches.

    q (B, Hq, D); k_cache, v_cache (num_blocks, page_size, Hk, D) (vLLM/FlashInfer NHD pages);
    block_table int32 (B, max_blocks); seq_lens int32 (B,): tokens already in the cache
    (the new token's K/V included: call ``tessera.append_kv`` first).  Hk divides Hq.

Math (ref.py): query head j uses kv head j // (Hq/Hk); keys t < n = seq_lens[b], and with
window > 0 only the last ``window`` of them; s = scale * <q, k> (scale defaults to D^-0.5),
softcap > 0 caps s to softcap * tanh(s / softcap); out = softmax(s) @ V, 0 for a sequence
without keys.  int8/float8_e4m3fn caches carry float32 scales per (token, head) (k_scale,
v_scale: (num_blocks, page_size, Hk)) and are dequantised on the fly (x = q * scale).
fp32 accumulation on every backend; out has q's dtype.  Inference only (no gradient).

Kernels are flash-decoding: the keys of each (sequence, kv head) are cut into splits
processed in parallel (partial max / sum / accumulator per split, one combine pass), each
task serving the whole GQA group so every K/V byte is read once.  The opencl kernel
(decode_attention.cl) does the same with one work-group per (sequence, kv head, split), the
scores, probabilities and row indices of a tile of keys in local memory.

Roofline (bytes that must cross DRAM): the K and V rows attended (+ their scales), q and out;
all but q/out are reads, so ``tessera bench`` judges the rate against a read-only pass over
one linear buffer (``bound="read"``), and also against a plain read of the same scattered
pages through the block table (``layout_read``: paged_read.c, reported as ``%layout``).
Pages scattered by the table read slower than one buffer: each 16-token page restarts the
hardware prefetcher's stream (the measured rates: ``benchmarks/results/2026-12-03e-cpu/``).

AVX-512 inner loops (``decode_fast.h``): 16 (query head, key) dot products at once with one
shuffle-add reduction for all 16, exponentials 16 keys at a time, and by (q, cache) dtype:
bf16 q x bf16 cache with ``vdpbf16ps`` (probabilities rounded to bf16 for P.V, as
FlashAttention does, the normaliser sums the rounded values); fp16/bf16 q x int8 cache with
``vpdpwssd`` (q quantised to int16 per head, error <= 2^-16 of its max, ~100x below bf16
rounding); fp32 FMAs otherwise (all fp32 q); a few lines of the next chunk prefetched per head.

Why the kernel looks like this (figures: ``benchmarks/results/2026-12-03g-cpu/README.md``,
section "decode_attention design notes", and the later result folders): the bf16 cache's
compute mostly overlaps its loads, so it runs near the layout read; an int8 cache has half the
bytes and the same dot-product work, so it is compute-bound and not twice as fast.  Chunks:
32 keys for 16/32-bit caches, 64 for int8 (df_chunk_keys).  The prefetch placement, hints,
chunk sizes and score layouts that were tried and measured slower or equal are listed there.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct
from ..._registry import BackendError, OpSpec, backend_available, register_op, select
from ..append_kv import check_cache_pair, check_index, check_pages, host_ints
from .cases import bench_cases, cases
from .ref import decode_attention_eager, decode_attention_ref, keys_read

OP = "decode_attention"


def _check(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale):
    """Everything but the index values (check_indices)."""
    _checks.tensor(OP, "q", q)
    if q.dim() != 3 or q.shape[-1] == 0:
        raise ValueError(f"tessera.{OP}: argument 'q' ({_checks.describe(q)}) must be (batch, Hq, D) with D > 0")
    check_cache_pair(OP, k_cache, v_cache, k_scale, v_scale)
    Hk, D = k_cache.shape[2:]
    B, Hq = q.shape[0], q.shape[1]
    if D != q.shape[-1] or Hq % Hk:
        raise ValueError(f"tessera.{OP}: argument 'k_cache' ({_checks.describe(k_cache)}) must have head dim "
                         f"D = {q.shape[-1]} and a head count Hk dividing Hq = {Hq} of 'q' ({_checks.describe(q)})")
    check_index(OP, "block_table", block_table, (B, None), "batch, max_blocks_per_seq")
    check_index(OP, "seq_lens", seq_lens, (B,), "batch")
    _checks.same_device(OP, "q", q, k_cache=k_cache, block_table=block_table, seq_lens=seq_lens)
    if scale is not None:
        _checks.finite_float(OP, "scale", scale)
    _checks.finite_float(OP, "softcap", softcap, min_value=0.0)
    if isinstance(window, bool) or not isinstance(window, (int, torch.SymInt)):
        raise TypeError(f"tessera.{OP}: argument 'window' must be an int, got {type(window).__name__}")
    if not (window == -1 or window > 0):
        raise ValueError(f"tessera.{OP}: argument 'window'={window} must be -1 (no window) or > 0")


def check_indices(k_cache, block_table, seq_lens, window):
    """Every seq_lens value in [0, capacity] and every block_table entry of a page some sequence
    attends to in [0, num_blocks); returns the most keys any sequence attends to.  (The cpu
    kernel does the same checks itself and calls this only to name a bad index.)"""
    if not seq_lens.numel():
        return 0
    NB, P = k_cache.shape[:2]
    n = host_ints(seq_lens)
    cap = block_table.shape[1] * P
    if ((n < 0) | (n > cap)).any():
        raise ValueError(f"tessera.{OP}: argument 'seq_lens' (values {n.tolist()[:8]}, {_checks.describe(seq_lens)}) "
                         f"must be in [0, {cap}] (block_table columns {block_table.shape[1]} x page_size {P})")
    lo = np.maximum(n - window, 0) if window > 0 else np.zeros_like(n)
    check_pages(OP, block_table, lo, n, P, NB, "k_cache")
    return int((n - lo).max())  # the most keys any sequence attends to


def _decode_attention_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                      scale: Optional[float], softcap: float, window: int, k_scale: Optional[Tensor],
                      v_scale: Optional[Tensor], backend: str) -> Tensor:
    _check(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale)
    mod = select(SPEC, q.device, q.dtype, backend)
    max_keys = None if getattr(mod, "CHECKS_INDICES", False) else check_indices(k_cache, block_table, seq_lens, window)
    if k_cache.dtype not in mod.CACHE_DTYPES:
        raise BackendError(f"tessera.{OP}: the selected backend ({mod.__name__}) cannot read a {k_cache.dtype} "
                           f"cache (has: {mod.CACHE_DTYPES})")
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return mod.forward(contiguous(q), k_cache, v_cache, contiguous(block_table), contiguous(seq_lens), sc,
                       float(softcap), int(window), k_scale, v_scale, max_keys)


_decode_attention = torch.library.custom_op("tessera::decode_attention", mutates_args=())(_decode_attention_impl)


@_decode_attention.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, backend):
    _check(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale)
    return q.new_empty(q.shape)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor,
                     scale: Optional[float] = None, softcap: float = 0.0, window: int = -1,
                     k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None, *,
                     backend: Optional[str] = None) -> Tensor:
    """Attention of one query token per sequence over its paged cache; see the module doc."""
    _checks.python_types(OP, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
                              "seq_lens": seq_lens, "k_scale": k_scale, "v_scale": v_scale}, {"softcap": softcap})
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table), ("seq_lens", seq_lens)):
        if not isinstance(t, Tensor):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if scale is not None:
        _checks.python_types(OP, {"q": q}, {"scale": scale})
    if isinstance(window, bool) or not isinstance(window, (int, torch.SymInt)):
        raise TypeError(f"tessera.{OP}: argument 'window' must be an int, got {type(window).__name__}")
    run = direct(_decode_attention, _decode_attention_impl,
                 q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale)
    return run(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale,
               _checks.backend_arg(OP, backend))


def _kv_keys(kw):
    return int(keys_read(kw["seq_lens"], kw.get("window", -1)).sum())


def _bytes_fwd(kw):
    q, kc = kw["q"], kw["k_cache"]
    Hk, D = kc.shape[2], kc.shape[3]
    rows = _kv_keys(kw) * Hk  # (token, kv head) rows of K and of V
    b = 2 * rows * D * kc.element_size() + (2 * rows * 4 if kw.get("k_scale") is not None else 0)
    return b + 2 * q.numel() * q.element_size()


def _flops_fwd(kw):
    q = kw["q"]
    return 4 * _kv_keys(kw) * (q.shape[1] // kw["k_cache"].shape[2]) * kw["k_cache"].shape[2] * q.shape[2]


def _paged_read(kw):
    """The bench's plain read of the attended pages (cpu/paged_read.c); None off the CPU or
    without a C compiler."""
    if kw["k_cache"].device.type != "cpu" or not backend_available("cpu", kw["k_cache"].device)[0]:
        return None
    from . import cpu
    return cpu.paged_read(kw)


SPEC = register_op(OpSpec(
    name=OP, fn=decode_attention, ref=decode_attention_ref, eager=decode_attention_eager,
    kernels={"reference": "tessera.ops.decode_attention.ref", "cpu": "tessera.ops.decode_attention.cpu",
             "triton": "tessera.ops.decode_attention.triton", "opencl": "tessera.ops.decode_attention.opencl",
             "cpu:aarch64": "tessera.ops.decode_attention.cross", "cpu:riscv64": "tessera.ops.decode_attention.cross"},
    cases=cases(), grad_inputs=(), bytes_fwd=_bytes_fwd, flops_fwd=_flops_fwd, bench_cases=bench_cases(),
    bound="read",  # the KV cache is read once; judged against a read-only pass over its bytes
    layout_read=_paged_read,  # ... and against a plain read of the same scattered pages
    fuzz="test_decode_attention.py",  # paged-cache inputs: fuzzed there (hypothesis)
))
