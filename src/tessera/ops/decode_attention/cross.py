"""Paged decode attention launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel:
decode_attention.c, cross-compiled into the remote runner; runtime: backends/cross.py).  Same entry point
and arguments as cpu.py, one thread; the caches travel to the runner as input buffers.  As on cpu, the
kernel checks seq_lens and the block-table entries it follows; on a refusal the op's check names them."""
from __future__ import annotations

import torch

from ..._library import new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE, PARALLEL_MIN_ELEMENTS
from ..append_kv.cpu import CACHE_CODE
from ..append_kv.ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHECKS_INDICES = True


def forward(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, max_keys=None):
    B, Hq, D = q.shape
    NB, P, Hk = k_cache.shape[:3]
    out = new_output((B, Hq, D), q.dtype, q.device)
    if B == 0:
        return out
    rc = cross.call("tsr_decode_attention", q, k_cache, v_cache, k_scale, v_scale, block_table, seq_lens, out,
                    B, Hq, Hk, D, P, block_table.shape[1], NB, scale, softcap, window,
                    DTYPE_CODE[q.dtype], CACHE_CODE[k_cache.dtype], 1, PARALLEL_MIN_ELEMENTS)
    if rc == -2:
        from . import check_indices  # names the bad seq_lens value or block_table entry
        check_indices(k_cache, block_table, seq_lens, window)
    cross.check_rc(rc, "decode_attention")
    return out


def backward(*args):
    raise NotImplementedError("decode_attention has no gradient (inference only)")
