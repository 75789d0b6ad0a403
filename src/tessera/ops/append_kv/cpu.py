"""append_kv native CPU launcher (kernel: append_kv.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...backends import cpu
from .ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("append_kv.c")
CACHE_CODE = {**cpu.DTYPE_CODE, torch.int8: 8, torch.float8_e4m3fn: 9}  # the C kernels' cache dtype codes
# (decode_attention/cpu.py reads the same table)


# The kernel checks positions and block-table entries itself before writing anything (the host
# check costs ~10 us of numpy per call, ~100 us with the caches cold between a decode step's
# GEMMs); on TSR_EINVAL the op runs the host check, which names the bad value.
CHECKS_INDICES = True


def forward(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale):
    """-> False when an index is out of range (nothing written), else True."""
    B, n, Hk, D = k.shape
    f = cpu.declare(cpu.library("append_kv", _SRC), "tsr_append_kv", "pppppllllllliii")
    for x, c, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        rc = f(cpu.ptr(x), cpu.ptr(c), cpu.ptr(s), cpu.ptr(block_table), cpu.ptr(positions), B, n, Hk, D,
               k_cache.shape[1], block_table.shape[1], k_cache.shape[0], cpu.DTYPE_CODE[x.dtype],
               CACHE_CODE[c.dtype], cpu.threads_for(x.numel()))
        if rc == -2:  # (the k call checks first: nothing has been written)
            return False
        cpu.check_rc(rc, "append_kv")
    return True


def backward(*args):
    raise NotImplementedError("append_kv has no gradient (inference only)")
