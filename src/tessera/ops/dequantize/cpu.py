"""dequantize_blocks native CPU launcher (kernel: dequantize.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...backends import cpu
from .ref import launch_plan

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("dequantize.c")
KIND = {torch.int8: 0, torch.int16: 1, torch.uint8: 2, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4,
        torch.float8_e4m3fnuz: 5}


def forward(data, scale, zero, block_rows, block, dtype):
    M, K, (br, bc, Kb), out, q = launch_plan(data, block_rows, block, dtype)
    if M == 0:
        return out
    f = cpu.declare(cpu.library("dequantize", _SRC), "tsr_dequantize_blocks", "plllipplllpiii")
    rc = f(cpu.ptr(q), data.stride(0), M, K, KIND[data.dtype], cpu.ptr(scale), cpu.ptr(zero), br, bc, Kb,
           cpu.ptr(out), cpu.DTYPE_CODE[dtype], cpu.use_nt(out), cpu.threads_for(M * K))
    cpu.check_rc(rc, "dequantize_blocks")
    return out


def backward(*args):
    raise NotImplementedError("dequantize_blocks has no gradient")
