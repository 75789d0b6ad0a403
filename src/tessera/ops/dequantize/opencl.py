"""dequantize_blocks opencl launcher (kernel: dequantize.cl; runtime: backends/opencl.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...backends import opencl as cl
from ..quantize.opencl import row_local_size
from .cpu import KIND
from .ref import launch_plan

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("dequantize.cl")


def forward(data, scale, zero, block_rows, block, dtype):
    M, K, (br, bc, Kb), out, q = launch_plan(data, block_rows, block, dtype)
    if M == 0:
        return out
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[dtype], "DQKIND": KIND[data.dtype]})
    L = row_local_size(K)
    seq = int(Kb > 1 and bc <= 1024)   # small blocks: one work-item per block
    bout = cl.buffer(out)
    cl.launch(prg, "dequant_rows", (M * L,), (L,),
              [cl.buffer(q), cl.i64(data.stride(0)), cl.i64(K), cl.i64(br), cl.i64(bc), cl.i64(Kb), cl.i32(seq),
               cl.buffer(scale), cl.buffer(zero), cl.i32(zero is not None), bout], written=(bout,))
    return out


def backward(*args):
    raise NotImplementedError("dequantize_blocks has no gradient")
