"""Append new key/value tokens to a paged KV cache, in place (``tessera.append_kv``).

Layout (vLLM / FlashInfer "NHD" pages): ``k_cache``, ``v_cache`` are (num_blocks, page_size,
Hk, D); sequence b's token t lives in page ``block_table[b, t // page_size]`` at slot
``t % page_size``.  ``k``, ``v`` are (B, n_new, Hk, D) (or (B, Hk, D) for one token) and
token i of sequence b is written at position ``positions[b] + i``.

Cache dtypes: fp32/fp16/bf16 (the new values are cast with round-to-nearest-even), or int8 /
float8_e4m3fn with one float32 scale per (token, head) in ``k_scale``/``v_scale``
(num_blocks, page_size, Hk), quantised by the integer contract documented in ``ref.py``
(absmax per (token, head), fp32 scale = max(amax, 1e-12) / QMAX, correctly rounded fp32
division, round half to even, saturation, NaN -> 0): bit-identical on every backend.

Validation happens on the host before anything is written (this reads ``block_table`` and
``positions``: a device sync on GPUs): every page the new tokens land in must be a valid
block index, and ``positions + n_new`` must fit the table's capacity.  Two sequences that
share a page slot race (not checked, as in vLLM).

Returns the updated ``(k_cache, v_cache)`` (the same tensors), plus ``(k_scale, v_scale)``
for quantised caches.  Inference only: no gradient.

Roofline: reads k and v, writes the same number of cache elements (+ scales).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ... import _checks
from ..._library import direct
from ..._registry import BackendError, OpSpec, register_op, select
from .cases import bench_cases, cases
from .ref import CACHE_DTYPES, QMAX, append_kv_eager, append_kv_ref

OP = "append_kv"


def check_index(op, name, t, shape, what):
    """An int32 index tensor of exactly ``shape`` (None = any size there)."""
    _checks.tensor(op, name, t, dtypes=(torch.int32,))
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"tessera.{op}: argument '{name}' ({_checks.describe(t)}) must have shape {want} ({what})")


def host_ints(t):
    """An index tensor's values on the host, as int64 numpy (cheap: no torch ops on the launch path)."""
    return t.detach().cpu().numpy().astype(np.int64)


def check_pages(op, block_table, lo, hi, page, num_blocks, cache_name):
    """Host check: for each sequence b, the table entries of tokens [lo[b], hi[b]) are in [0, num_blocks).
    lo, hi: int64 numpy arrays."""
    bt = block_table.detach().cpu().numpy()
    col = np.arange(bt.shape[1])
    live = hi > lo
    used = (col[None, :] >= (lo // page)[:, None]) & (col[None, :] < ((hi + page - 1) // page)[:, None]) & live[:, None]
    bad = used & ((bt < 0) | (bt >= num_blocks))
    if bad.any():
        b, j = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"tessera.{op}: argument 'block_table' ({_checks.describe(block_table)}) has entry "
                         f"{int(bt[b, j])} at [{b}, {j}], outside [0, {num_blocks}) (num_blocks of '{cache_name}')")


def check_cache_pair(op, k_cache, v_cache, k_scale, v_scale):
    _checks.tensor(op, "k_cache", k_cache, dtypes=CACHE_DTYPES)
    _checks.tensor(op, "v_cache", v_cache, dtypes=CACHE_DTYPES)
    if k_cache.dim() != 4:
        raise ValueError(f"tessera.{op}: argument 'k_cache' ({_checks.describe(k_cache)}) must be 4-D "
                         "(num_blocks, page_size, Hk, D)")
    _checks.same_shape(op, "k_cache", k_cache, "v_cache", v_cache)
    _checks.same_dtype(op, "k_cache", k_cache, "v_cache", v_cache)
    for n, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not c.is_contiguous() or min(c.shape) == 0:
            raise ValueError(f"tessera.{op}: argument '{n}' ({_checks.describe(c)}) must be contiguous and non-empty")
    quant = k_cache.dtype in QMAX
    NB, P, Hk, _ = k_cache.shape
    for n, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not quant:
            if s is not None:
                raise ValueError(f"tessera.{op}: argument '{n}' ({_checks.describe(s)}) must be None for a "
                                 f"{k_cache.dtype} cache (scales belong to int8/float8_e4m3fn caches)")
            continue
        if s is None:
            raise ValueError(f"tessera.{op}: argument '{n}' is required for a {k_cache.dtype} cache: float32 "
                             f"of shape {(NB, P, Hk)}")
        _checks.tensor(op, n, s, dtypes=(torch.float32,))
        if tuple(s.shape) != (NB, P, Hk) or not s.is_contiguous():
            raise ValueError(f"tessera.{op}: argument '{n}' ({_checks.describe(s)}) must be contiguous of shape "
                             f"{(NB, P, Hk)} (num_blocks, page_size, Hk of 'k_cache')")
    _checks.same_device(op, "k_cache", k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)


def _check(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale, values=True):
    _checks.tensor(OP, "k", k)
    _checks.tensor(OP, "v", v)
    if k.dim() not in (3, 4):
        raise ValueError(f"tessera.{OP}: argument 'k' ({_checks.describe(k)}) must be (batch, n_new, Hk, D) "
                         "or (batch, Hk, D)")
    _checks.same_shape(OP, "k", k, "v", v)
    _checks.same_dtype(OP, "k", k, "v", v)
    check_cache_pair(OP, k_cache, v_cache, k_scale, v_scale)
    NB, P, Hk, D = k_cache.shape
    if tuple(k.shape[-2:]) != (Hk, D):
        raise ValueError(f"tessera.{OP}: argument 'k' ({_checks.describe(k)}) must end with (Hk, D) = "
                         f"{(Hk, D)} of 'k_cache' ({_checks.describe(k_cache)})")
    B = k.shape[0]
    n_new = 1 if k.dim() == 3 else k.shape[1]
    check_index(OP, "block_table", block_table, (B, None), "batch, max_blocks_per_seq")
    check_index(OP, "positions", positions, (B,), "batch")
    _checks.same_device(OP, "k", k, v=v, k_cache=k_cache, block_table=block_table, positions=positions)
    if values and B and n_new:
        cap = block_table.shape[1] * P
        pos = host_ints(positions)
        if ((pos < 0) | (pos + n_new > cap)).any():
            raise ValueError(f"tessera.{OP}: argument 'positions' (values {pos.tolist()[:8]}, {_checks.describe(positions)}) "
                             f"must satisfy 0 <= positions and positions + n_new ({n_new}) <= capacity {cap} "
                             f"(block_table columns {block_table.shape[1]} x page_size {P})")
        check_pages(OP, block_table, pos, pos + n_new, P, NB, "k_cache")


def _append_kv_impl(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, positions: Tensor,
               k_scale: Optional[Tensor], v_scale: Optional[Tensor], backend: str) -> None:
    _check(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale, values=False)
    mod = select(SPEC, k.device, k.dtype, backend)
    # a kernel that checks the index values itself (CHECKS_INDICES) skips the host check, which
    # runs only to name the bad value when the kernel refuses
    checked = getattr(mod, "CHECKS_INDICES", False)
    if not checked:
        _check(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale)
    if k_cache.dtype not in mod.CACHE_DTYPES:
        raise BackendError(f"tessera.{OP}: the selected backend ({mod.__name__}) cannot write a {k_cache.dtype} "
                           f"cache (has: {mod.CACHE_DTYPES})")
    if k.dim() == 3:
        k, v = k.unsqueeze(1), v.unsqueeze(1)
    if k.numel() == 0:
        return
    ok = mod.forward(k.contiguous(), v.contiguous(), k_cache, v_cache, block_table.contiguous(),
                     positions.contiguous(), k_scale, v_scale)
    if checked and not ok:
        _check(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale)  # raises, naming the value
        raise RuntimeError(f"tessera.{OP}: the kernel refused an index the host check accepts (a bug)")


_append_kv = torch.library.custom_op("tessera::append_kv", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))(_append_kv_impl)


@_append_kv.register_fake
def _(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale, backend):
    _check(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale, values=False)


def append_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, positions: Tensor,
              k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None, *, backend: Optional[str] = None):
    """Write k, v (B, n_new, Hk, D) or (B, Hk, D) into the paged caches at ``positions``; see the module doc.

    Returns ``(k_cache, v_cache)`` or, for int8/fp8 caches, ``(k_cache, v_cache, k_scale, v_scale)``."""
    _checks.python_types(OP, {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "block_table": block_table,
                              "positions": positions, "k_scale": k_scale, "v_scale": v_scale})
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("positions", positions)):
        if not isinstance(t, Tensor):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    run = direct(_append_kv, _append_kv_impl,
                 k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale)
    run(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale, _checks.backend_arg(OP, backend))
    if k_scale is not None or v_scale is not None:
        return k_cache, v_cache, k_scale, v_scale
    return k_cache, v_cache


def _bytes_fwd(kw):
    k, c = kw["k"], kw["k_cache"]
    n = k.numel() // k.shape[-1]  # (token, head) rows
    b = 2 * k.numel() * (k.element_size() + c.element_size())
    return b + (2 * n * 4 if kw.get("k_scale") is not None else 0)


SPEC = register_op(OpSpec(
    name=OP, fn=append_kv, ref=append_kv_ref, eager=append_kv_eager,
    kernels={"reference": "tessera.ops.append_kv.ref", "cpu": "tessera.ops.append_kv.cpu",
             "triton": "tessera.ops.append_kv.triton", "opencl": "tessera.ops.append_kv.opencl",
             "cpu:aarch64": "tessera.ops.append_kv.cross", "cpu:riscv64": "tessera.ops.append_kv.cross"},
    cases=cases(quantised=False) + cases(quantised=True), grad_inputs=(),
    mutates=("k_cache", "v_cache", "k_scale", "v_scale"),
    bytes_fwd=_bytes_fwd, bench_cases=bench_cases(),
    fuzz="test_decode_attention.py",  # paged-cache inputs: fuzzed there (hypothesis)
    # quantised caches: the scales (outputs 2, 3) are float32 whatever k's dtype
    out_dtypes={2: torch.float32, 3: torch.float32},
))
