"""linear_fp8 opencl launcher (kernel: linear_fp8.cl; runtime: backends/opencl.py).

Two launches: ``f8_quant_rows`` (x -> e4m3 values and scales, the integer contract, into
workspaces) and ``f8_dot14`` (decode, M <= 2) or ``f8_dot24``.  No backward.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, new_output
from ...backends import opencl as cl
from ..quantize.opencl import row_local_size
from .._qlinear_int8.opencl import dot_grid
from .._qlinear_int8.ref import ACT_CODE
from .ref import BLOCK, scale_kind

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("linear_fp8.cl")
_SKIND = {"tensor": 0, "row": 1, "block": 2}


def forward(x, weight, weight_scale, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    kind = _SKIND[scale_kind(weight_scale)]
    KB = -(-K // BLOCK) if kind == 2 else 1
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[x.dtype], "E5M2": int(weight.dtype == torch.float8_e5m2),
                            "SKIND": kind})
    qx = new_output((M, K), torch.float32, x.device)
    sx = new_output((M, KB), torch.float32, x.device)
    L = row_local_size(K)
    bq, bs = cl.buffer(qx), cl.buffer(sx)
    cl.launch(prg, "f8_quant_rows", (M * L,), (L,),
              [cl.buffer(x), cl.i64(x.stride(0)), cl.i64(K), bq, bs, cl.local_floats(L)], written=(bq, bs))
    b = as_fp32_param(bias)
    dr, dc = (1, 4) if M <= 2 else (2, 4)
    by = cl.buffer(y)
    cl.launch(prg, f"f8_dot{dr}{dc}", *dot_grid(M, N, dr, dc),
              [bq, bs, cl.buffer(weight.view(torch.uint8)), cl.buffer(weight_scale), cl.buffer(b),
               cl.i32(b is not None), cl.i32(ACT_CODE[activation]), cl.i64(M), cl.i64(N), cl.i64(K), by],
              written=(by,))
    return y


def backward(*args):
    raise NotImplementedError("linear_fp8 has no gradient (inference only)")
