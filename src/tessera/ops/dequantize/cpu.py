"""dequantize_blocks native CPU launcher (kernel: dequantize.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu
from ..quantize.ref import grid

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("dequantize.c")
KIND = {torch.int8: 0, torch.int16: 1, torch.uint8: 2, torch.float8_e4m3fn: 3, torch.float8_e5m2: 4,
        torch.float8_e4m3fnuz: 5}


def forward(data, scale, zero, block_rows, block, dtype):
    M = data.shape[0]
    K = data.shape[1] * (2 if data.dtype == torch.uint8 else 1)
    br, bc, _, Kb = grid(M, K, block_rows, block)
    out = new_output((M, K), dtype, data.device)
    if M == 0:
        return out
    q = data.view(torch.uint8) if data.dtype.is_floating_point else data
    f = cpu.declare(cpu.library("dequantize", _SRC), "tsr_dequantize_blocks", "plllipplllpiii")
    rc = f(cpu.ptr(q), data.stride(0), M, K, KIND[data.dtype], cpu.ptr(scale), cpu.ptr(zero), br, bc, Kb,
           cpu.ptr(out), cpu.DTYPE_CODE[dtype], cpu.use_nt(out), cpu.threads_for(M * K))
    cpu.check_rc(rc, "dequantize_blocks")
    return out


def backward(*args):
    raise NotImplementedError("dequantize_blocks has no gradient")
