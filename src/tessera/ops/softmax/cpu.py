"""Softmax native CPU launcher (kernel: softmax.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("softmax.c")

# Rows up to this many elements are converted once into an fp32 scratch (256 KiB per buffer,
# L2-resident) and read from DRAM once; longer rows are streamed in chunks of this size with
# an online max/sum and read twice.  Read at call time, so a test may lower it to exercise
# the chunked path on small rows.
SCRATCH_ELEMS = 1 << 16


def _lib():
    return cpu.library("softmax", _SRC)


def forward(x):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    f = cpu.declare(_lib(), "tsr_softmax_fwd", "plplliili")
    rc = f(cpu.ptr(x), x.stride(0), cpu.ptr(y), M, N, cpu.DTYPE_CODE[x.dtype], cpu.use_nt(y),
           int(SCRATCH_ELEMS), cpu.threads_for(M * N))
    cpu.check_rc(rc, "softmax forward")
    return y


def backward(dy, y):
    M, N = y.shape
    dx = new_output((M, N), y.dtype, y.device)
    if M == 0 or N == 0:
        return dx
    f = cpu.declare(_lib(), "tsr_softmax_bwd", "plplplliili")
    rc = f(cpu.ptr(dy), dy.stride(0), cpu.ptr(y), y.stride(0), cpu.ptr(dx), M, N, cpu.DTYPE_CODE[y.dtype],
           cpu.use_nt(dx), int(SCRATCH_ELEMS), cpu.threads_for(M * N))
    cpu.check_rc(rc, "softmax backward")
    return dx
