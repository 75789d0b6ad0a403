"""append_kv launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: append_kv.c, cross-compiled
into the remote runner; runtime: backends/cross.py).  Same C entry point and arguments as cpu.py, one
thread; the caches (and int8/fp8 scales) travel to the runner and back as in-out buffers, so a call costs
the caches' size on the pipe: this backend exists to check the kernels on the target ISA, and a board
runs the C library (`tessera build`) on its own memory."""
from __future__ import annotations

import torch

from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .cpu import CACHE_CODE
from .ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHECKS_INDICES = True  # as on cpu: the kernel refuses an out-of-range index before writing anything


def forward(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale):
    """-> False when an index is out of range (nothing written), else True."""
    B, n, Hk, D = k.shape
    for x, c, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        rc = cross.call("tsr_append_kv", x, c, s, block_table, positions, B, n, Hk, D, k_cache.shape[1],
                        block_table.shape[1], k_cache.shape[0], DTYPE_CODE[x.dtype], CACHE_CODE[c.dtype], 1)
        if rc == -2:
            return False
        cross.check_rc(rc, "append_kv")
    return True


def backward(*args):
    raise NotImplementedError("append_kv has no gradient (inference only)")
