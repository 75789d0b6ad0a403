"""Paged decode attention opencl launcher (kernels: decode_attention.cl; runtime: backends/opencl.py).

Caches of every dtype append_kv writes (fp32/fp16/bf16, int8 and float8_e4m3fn with per-(token,
head) fp32 scales) are read in place through zero-copy buffers over the cache tensors.  Three
launches: decode_prep_q (q -> fp32, zero padded to a multiple of 8 dims), decode_split (one
work-group per (sequence, kv head, split)) and decode_combine (the splits of each head merged).

The op's host-side index check (``check_indices``) runs before this module is called: every
seq_lens value and every block-table entry of an attended page is in range, and it returns the
most keys any sequence attends to, from which the split count follows: enough work-groups to
give every compute unit ~4, but no split shorter than ~256 keys (the cpu kernel's rule, with
(sequence, kv head) groups in place of its per-sequence tasks).  Keys per tile (N) are sized so
that the group's local memory (scores G x N, m / l / alpha, N row indices) stays under 16 KiB.
``LOCAL_SIZE`` (None: 64) is read at call time; tests set odd sizes (the result is the same).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import opencl as cl
from ..append_kv.cpu import CACHE_CODE  # one table of the cache dtype codes (the cl kernels use it too)
from ..append_kv.ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)
from .ref import keys_read

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("decode_attention.cl")
LOCAL_SIZE: int | None = None
_LOCAL_BYTES = 16384


def _splits(B: int, Hk: int, max_keys: int) -> int:
    """Splits per (sequence, kv head): ~4 work-groups per compute unit, no split under ~256 keys."""
    cu = int(cl.runtime().device.max_compute_units)
    want = -(-4 * cu // max(1, B * Hk))
    return max(1, min(want, max_keys // 256))


def _tile_keys(G: int) -> int:
    """Keys per tile N: (G N + N) floats / ints + 3 G floats of local memory <= _LOCAL_BYTES."""
    n = 64
    while n > 1 and 4 * (G * n + n + 3 * G) > _LOCAL_BYTES:
        n //= 2
    return n


def forward(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, max_keys=None):
    B, Hq, D = q.shape
    P, Hk = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hk
    out = new_output((B, Hq, D), q.dtype, q.device)
    if B == 0:
        return out
    if max_keys is None:
        max_keys = int(keys_read(seq_lens, window).max())
    S = _splits(B, Hk, max_keys)
    N = _tile_keys(G)
    L = max(1, min(LOCAL_SIZE or 64, cl.runtime().max_wg))
    D8 = -(-D // 8)
    # kernel-written workspaces: new_output (poisoned / fenced under test like the outputs)
    q32 = new_output((B * Hq * D8 * 8,), torch.float32, q.device)
    pml = new_output((B * Hk * S * 2 * G,), torch.float32, q.device)
    pacc = new_output((B * Hk * S * G * D8 * 8,), torch.float32, q.device)
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[q.dtype], "DEC_CACHE": CACHE_CODE[k_cache.dtype]})
    bq, bml, bacc, bo = cl.buffer(q32), cl.buffer(pml), cl.buffer(pacc), cl.buffer(out)
    n = q32.numel()
    E = cl.row_local_size(64)   # elementwise kernels: one fixed local size (PoCL compiles one per size)
    cl.launch(prg, "decode_prep_q", (cl.round_up(n, E),), (E,),
              [cl.buffer(q), cl.i32(D), cl.i32(8 * D8), cl.i64(n), bq], written=(bq,))
    cl.launch(prg, "decode_split", (B * Hk * S * L,), (L,),
              [bq, cl.buffer(k_cache), cl.buffer(v_cache), cl.buffer(k_scale), cl.buffer(v_scale),
               cl.buffer(block_table), cl.buffer(seq_lens), cl.i32(Hk), cl.i32(G), cl.i32(D), cl.i32(P),
               cl.i32(block_table.shape[1]), cl.i32(S), cl.i32(window), cl.f32(scale), cl.f32(softcap), cl.i32(N),
               bml, bacc, cl.local_floats(G * N), cl.local_floats(3 * G), cl.local_floats(N)],
              written=(bml, bacc))
    total = out.numel()
    cl.launch(prg, "decode_combine", (cl.round_up(total, E),), (E,),
              [bml, bacc, cl.i32(Hk), cl.i32(G), cl.i32(D), cl.i32(S), cl.i64(total), bo], written=(bo,))
    return out


def backward(*args):
    raise NotImplementedError("decode_attention has no gradient (inference only)")
