"""Attention opencl launcher, forward only (kernel: attention.cl; runtime: backends/opencl.py).

The kernel-module interface of ``ref.py`` / ``cpu.py``: packed varlen (tokens, heads, D) inputs
with any token/head strides and unit last stride, int32 cu_seqlens; returns ``out`` (Tq, Hq, D)
in q's dtype and ``lse`` (Hq, Tq) fp32.  The issue asks no attention backward of this backend:
``BACKWARD = False``, and a gradient request raises BackendError (``_registry.forward_only``).

Work-groups: (block of L query rows of one sequence, q head).  The block table (sequence, first
row) is built on the host from cu_seqlens_q, in descending order of the first row (under a causal
mask the late blocks see the most keys: the heaviest groups start first, the last to finish are
short).  Build options: ATT_DMAX = head_dim rounded up to a power of two (>= 16; the private
arrays' size: one program per bucket, not per head_dim) and ATT_BN = keys per local-memory tile,
ATT_BN x ATT_DMAX = 4096 floats per K or V tile (32 KiB for both), halved while the two tiles
take more than half the device's local memory (so two groups fit on a compute unit).
``LOCAL_SIZE`` (None: 64, one size for every shape, as PoCL compiles a kernel per local size)
is read at call time; tests set it to odd sizes to check that L only groups rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..._library import new_output
from ..._registry import forward_only
from ...backends import opencl as cl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKWARD = False
backward = forward_only("attention", "opencl")
_SRC = Path(__file__).with_name("attention.cl")
LOCAL_SIZE: int | None = None   # query rows per work-group; None: automatic


def _tiles(D: int) -> tuple[int, int]:
    """(ATT_DMAX, ATT_BN) for head_dim D on the current device."""
    dmax = 16
    while dmax < D:
        dmax <<= 1
    bn = min(64, 4096 // dmax)
    local = int(cl.runtime().device.local_mem_size)
    while bn > 8 and 2 * bn * dmax * 4 > local // 2:
        bn //= 2
    return dmax, bn


def _local_size() -> int:
    """LOCAL_SIZE, or 64 (PoCL compiles a kernel per local size: one size for every shape)."""
    if LOCAL_SIZE is not None:
        return max(1, min(int(LOCAL_SIZE), cl.runtime().max_wg))
    return cl.row_local_size(64)


def _blocks(cu_q: torch.Tensor, L: int) -> torch.Tensor:
    """int32 (nblk, 2): (sequence, first query row) of every block of L rows, last rows first
    (numpy: a torch op here costs milliseconds of thread-pool wake-up next to the device's threads)."""
    cu = cu_q.numpy().astype(np.int64)
    nblk = (cu[1:] - cu[:-1] + L - 1) // L
    seq = np.repeat(np.arange(nblk.size), nblk)
    row = (np.arange(seq.size) - np.repeat(np.cumsum(nblk) - nblk, nblk)) * L
    order = np.argsort(-row, kind="stable")
    return torch.from_numpy(np.ascontiguousarray(np.stack([seq[order], row[order]], 1), dtype=np.int32))


def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, exact_lse=True):
    Tq, Hq, D = q.shape
    Hk = k.shape[1]
    out = new_output((Tq, Hq, D), q.dtype, q.device)
    lse = new_output((Hq, Tq), torch.float32, q.device)
    B = cu_q.shape[0] - 1
    if Tq == 0 or Hq == 0 or B == 0:
        return out, lse
    L = _local_size()
    blocks = _blocks(cu_q, L)
    dmax, bn = _tiles(D)
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[q.dtype], "ATT_DMAX": dmax, "ATT_BN": bn})
    bo, bl = cl.buffer(out), cl.buffer(lse)
    args = [cl.buffer(q), cl.i64(q.stride(0)), cl.i64(q.stride(1)), cl.buffer(k), cl.i64(k.stride(0)),
            cl.i64(k.stride(1)), cl.buffer(v), cl.i64(v.stride(0)), cl.i64(v.stride(1)), cl.buffer(cu_q),
            cl.buffer(cu_k), cl.buffer(blocks), cl.i32(Hq // Hk), cl.i32(D), cl.i64(Tq), cl.f32(scale),
            cl.i64(window_left), cl.i64(window_right), cl.f32(softcap), bo, bl,
            cl.local_floats(bn * dmax), cl.local_floats(bn * dmax)]
    cl.launch(prg, "attention_fwd", (blocks.shape[0] * L, Hq), (L, 1), args, written=(bo, bl))
    return out, lse
