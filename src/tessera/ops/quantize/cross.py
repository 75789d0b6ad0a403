"""quantize_blocks launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: quantize.c,
cross-compiled into the remote runner; runtime: backends/cross.py).  Integer codes are bit-exact
with every other backend (the kernel is the same C source)."""
from __future__ import annotations

import torch

from ..._library import new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .cpu import KIND
from .ref import QTYPES, grid

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def forward(x, qtype, block_rows, block):
    M, K = x.shape
    br, bc, Mb, Kb = grid(M, K, block_rows, block)
    dt, _, packed = QTYPES[qtype]
    codes = new_output((M, K // 2 if packed else K), dt, x.device)
    scale = new_output((Mb, Kb), torch.float32, x.device)
    zero = new_output((Mb, Kb), torch.uint8, x.device) if qtype == "int4_zp" else None
    out = codes.view(torch.uint8) if dt.is_floating_point else codes
    rc = cross.call("tsr_quantize_blocks", x, x.stride(0), M, K, DTYPE_CODE[x.dtype], KIND[qtype], br, bc, Mb, Kb,
                    out, scale, zero, 1)
    cross.check_rc(rc, "quantize_blocks")
    return codes, scale, zero


def backward(*args):
    raise NotImplementedError("quantize_blocks has no gradient")
