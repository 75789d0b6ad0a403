"""Softmax opencl launcher (kernel: softmax.cl; runtime: backends/opencl.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu, opencl as cl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("softmax.cl")


def _prg(dtype, out):
    # TSR_NT: streaming stores of `out` (tessera_cl.h), at the cpu backend's size threshold
    return cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[dtype], "TSR_NT": cpu.use_nt(out)})


def _keep_exp(N: int, L: int) -> bool:
    """Keep the row's exp values in local memory for the last pass (one exp per element instead
    of two) where the row fits in half the device's local memory -- on a CPU device (L == 1),
    where exp is the bottleneck; a GPU has the arithmetic to spare and the local memory to keep
    for occupancy, and recomputes."""
    if L != 1:
        return False
    rt = cl.runtime()
    lm = rt.__dict__.get("_tsr_local_mem")
    if lm is None:
        lm = rt._tsr_local_mem = int(rt.device.local_mem_size)
    return 4 * N <= lm // 2


def forward(x):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    L = cl.vec_local_size(N)
    keep = _keep_exp(N, L)
    by = cl.buffer(y)
    cl.launch(_prg(x.dtype, y), "softmax_fwd", (M * L,), (L,),
              [cl.buffer(x), cl.i64(x.stride(0)), by, cl.i64(M), cl.i64(N), cl.local_floats(N if keep else 1),
               cl.i32(keep), cl.local_floats(L)], written=(by,))
    return y


def backward(dy, y):
    M, N = y.shape
    dx = new_output((M, N), y.dtype, y.device)
    if M == 0 or N == 0:
        return dx
    L = cl.vec_local_size(N)
    bdx = cl.buffer(dx)
    cl.launch(_prg(y.dtype, dx), "softmax_bwd", (M * L,), (L,),
              [cl.buffer(dy), cl.i64(dy.stride(0)), cl.buffer(y), cl.i64(y.stride(0)), bdx, cl.i64(M), cl.i64(N),
               cl.local_floats(L)], written=(bdx,))
    return dx
