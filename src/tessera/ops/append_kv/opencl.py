"""append_kv opencl launcher (kernel: append_kv.cl; runtime: backends/opencl.py).

Writes in place: the buffers handed to the kernel are zero-copy views of the cache tensors' own
memory (``backends.opencl.buffer``), listed as written so that a device that copies (USE_HOST_PTR
honoured by a copy) maps them back before the call returns.  Every cache dtype of the op: float
caches converted with round to nearest even, int8 / float8_e4m3fn quantised by the integer contract
of ref.py bit for bit (its OpenCL definitions in csrc/opencl/tessera_quant_cl.h: correctly rounded
divisions on any device; see append_kv.cl).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...backends import opencl as cl
from .cpu import CACHE_CODE  # one table of the cache dtype codes
from .ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("append_kv.cl")


def _prg(x_dtype, cache_dtype):
    return cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[x_dtype], "AKV_CACHE": CACHE_CODE[cache_dtype]})


def forward(k, v, k_cache, v_cache, block_table, positions, k_scale, v_scale):
    B, n, Hk, D = k.shape
    if k.numel() == 0:
        return
    prg = _prg(k.dtype, k_cache.dtype)
    rows = B * n * Hk
    E = cl.row_local_size(64)   # one local size for every shape: PoCL compiles a kernel per local size
    bk, bv = cl.buffer(k_cache), cl.buffer(v_cache)
    bks, bvs = cl.buffer(k_scale), cl.buffer(v_scale)
    cl.launch(prg, "append_kv", (cl.round_up(2 * rows, E),), (E,),
              [cl.buffer(k), bk, bks, cl.buffer(v), bv, bvs, cl.buffer(block_table), cl.buffer(positions), cl.i32(n),
               cl.i32(Hk), cl.i32(D), cl.i32(k_cache.shape[1]), cl.i32(block_table.shape[1]), cl.i64(rows)],
              written=(bk, bv) + ((bks, bvs) if k_scale is not None else ()))


def backward(*args):
    raise NotImplementedError("append_kv has no gradient (inference only)")
