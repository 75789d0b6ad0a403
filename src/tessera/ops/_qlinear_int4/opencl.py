"""opencl launchers of linear_w4a16 / linear_w4a8 (kernel: qlinear_int4.cl; runtime: backends/opencl.py).

W4A8 quantises x per row first with the int8 family's ``qi8_quant_rows`` (the integer contract,
shared with linear_w8a8), into an int8 workspace and fp32 row scales; W4A16 converts x to an fp32
workspace permuted for the kernel (``q4_prep_x``).  No backward (inference ops).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, contiguous, new_output
from ...backends import opencl as cl
from ..quantize.opencl import row_local_size
from .._qlinear_int8.opencl import dot_grid, quantize_rows
from . import ACT_CODE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("qlinear_int4.cl")
# work-item blocks (x rows, weight rows): decode (M <= 2) reads the weight once -- W4A16 4 rows a
# work-item (each x load serves four), W4A8 one (its int8 dot product vectorises best alone);
# larger M 2 x 4, each weight byte serving two x rows (measured on PoCL, this CPU)
DECODE_MAX_M = 2
BLOCK = {(0, True): (1, 4), (1, True): (1, 1), (0, False): (2, 4), (1, False): (2, 4)}


def _forward(mode, x, weight, weight_scale, weight_zero, group_size, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    w, s, z, b = contiguous(weight), contiguous(weight_scale), contiguous(weight_zero), as_fp32_param(bias)
    prg = cl.program(_SRC, {"MODE": mode, "TSR_DTYPE": cl.DTYPE_CODE[x.dtype]})
    if mode == 1:
        xq, sx = quantize_rows(x, 8)
    else:   # fp32 x, 16-column chunks permuted [even k][odd k] (q4_prep_x)
        xq, sx = new_output((M, K), torch.float32, x.device), None
        bxq = cl.buffer(xq)
        L = row_local_size(K)
        cl.launch(prg, "q4_prep_x", (M * L,), (L,), [cl.buffer(x), cl.i64(x.stride(0)), cl.i64(K), bxq],
                  written=(bxq,))
    dr, dc = BLOCK[mode, M <= DECODE_MAX_M]
    by = cl.buffer(y)
    cl.launch(prg, f"q4_dot{dr}{dc}", *dot_grid(M, N, dr, dc),
              [cl.buffer(xq), cl.i64(xq.stride(0)), cl.buffer(sx), cl.buffer(w), cl.buffer(s), cl.buffer(z),
               cl.i32(z is not None), cl.buffer(b), cl.i32(b is not None), cl.i32(ACT_CODE[activation]),
               cl.i64(M), cl.i64(N), cl.i64(K), cl.i64(group_size), by], written=(by,))
    return y


def forward_w4a16(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(0, x, weight, weight_scale, weight_zero, group_size, bias, activation)


def forward_w4a8(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(1, x, weight, weight_scale, weight_zero, group_size, bias, activation)
