"""dequantize_blocks launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: dequantize.c,
cross-compiled into the remote runner; runtime: backends/cross.py)."""
from __future__ import annotations

import torch

from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .cpu import KIND
from .ref import launch_plan

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def forward(data, scale, zero, block_rows, block, dtype):
    M, K, (br, bc, Kb), out, q = launch_plan(data, block_rows, block, dtype)
    if M == 0:
        return out
    rc = cross.call("tsr_dequantize_blocks", q, data.stride(0), M, K, KIND[data.dtype], scale, zero, br, bc, Kb,
                    out, DTYPE_CODE[dtype], 0, 1)
    cross.check_rc(rc, "dequantize_blocks")
    return out


def backward(*args):
    raise NotImplementedError("dequantize_blocks has no gradient")
