"""quantize_blocks native CPU launcher (kernel: quantize.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu
from .ref import QTYPES, grid

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("quantize.c")
KIND = {"int8": 0, "int16": 1, "int4": 2, "int4_zp": 3, "q4_0": 4, "fp8_e4m3": 5, "fp8_e5m2": 6, "fp8_e4m3fnuz": 7}


def forward(x, qtype, block_rows, block):
    M, K = x.shape
    br, bc, Mb, Kb = grid(M, K, block_rows, block)
    dt, _, packed = QTYPES[qtype]
    codes = new_output((M, K // 2 if packed else K), dt, x.device)
    scale = new_output((Mb, Kb), torch.float32, x.device)
    zero = new_output((Mb, Kb), torch.uint8, x.device) if qtype == "int4_zp" else None
    f = cpu.declare(cpu.library("quantize", _SRC), "tsr_quantize_blocks", "plllii" + "llll" + "pppi")
    out = codes.view(torch.uint8) if dt.is_floating_point else codes
    rc = f(cpu.ptr(x), x.stride(0), M, K, cpu.DTYPE_CODE[x.dtype], KIND[qtype], br, bc, Mb, Kb,
           cpu.ptr(out), cpu.ptr(scale), cpu.ptr(zero), cpu.threads_for(M * K))
    cpu.check_rc(rc, "quantize_blocks")
    return codes, scale, zero


def backward(*args):
    raise NotImplementedError("quantize_blocks has no gradient")
