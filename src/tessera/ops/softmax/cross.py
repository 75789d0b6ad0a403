"""Softmax launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: softmax.c,
cross-compiled into the remote runner, where its portable ``omp simd`` loops are the vector path;
runtime: backends/cross.py).  Same C entry points and arguments as cpu.py; one thread, ordinary
stores."""
from __future__ import annotations

import torch

from ..._library import new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from . import cpu as _cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def forward(x):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    rc = cross.call("tsr_softmax_fwd", x, x.stride(0), y, M, N, DTYPE_CODE[x.dtype], 0, int(_cpu.SCRATCH_ELEMS), 1)
    cross.check_rc(rc, "softmax forward")
    return y


def backward(dy, y):
    M, N = y.shape
    dx = new_output((M, N), y.dtype, y.device)
    if M == 0 or N == 0:
        return dx
    rc = cross.call("tsr_softmax_bwd", dy, dy.stride(0), y, y.stride(0), dx, M, N, DTYPE_CODE[y.dtype], 0,
                    int(_cpu.SCRATCH_ELEMS), 1)
    cross.check_rc(rc, "softmax backward")
    return dx
