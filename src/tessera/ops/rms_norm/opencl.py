"""RMSNorm opencl launcher (kernel: rms_norm.cl; runtime: backends/opencl.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cpu, opencl as cl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("rms_norm.cl")


def _prg(dtype, out):
    # TSR_NT: streaming stores of `out` (tessera_cl.h), at the cpu backend's size threshold
    return cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[dtype], "TSR_NT": cpu.use_nt(out)})


def forward(x, weight, residual, eps):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, rstd
    w = as_fp32_param(weight)
    L = cl.vec_local_size(N)
    args = [cl.buffer(x), cl.i64(x.stride(0)), cl.buffer(residual), cl.i64(0 if residual is None else residual.stride(0)),
            cl.i32(residual is not None), cl.buffer(w), cl.i32(w is not None), by := cl.buffer(y), bh := cl.buffer(h),
            br := cl.buffer(rstd), cl.i64(M), cl.i64(N), cl.f32(eps), cl.local_floats(L)]
    # one row per work-group: the groups are the device's unit of load balance
    cl.launch(_prg(x.dtype, y), "rms_norm_fwd", (M * L,), (L,), args, written=(by, bh if h is not None else None, br))
    return y, h, rstd


def backward(dy, dh, h, weight, rstd, eps):
    M, N = h.shape
    dx = new_output((M, N), h.dtype, h.device)
    dw = None if weight is None else new_output((N,), torch.float32, h.device)
    if M == 0:
        if dw is not None:
            dw.zero_()
        return dx, dw
    w = as_fp32_param(weight)
    L = cl.vec_local_size(N)
    G = cl.row_groups(M)
    per = -(-M // G)
    G = -(-M // per)
    part = new_output((G, N), torch.float32, h.device) if dw is not None else None
    prg = _prg(h.dtype, dx)
    bpart = cl.buffer(part)
    bdx = cl.buffer(dx)
    cl.launch(prg, "rms_norm_bwd", (G * L,), (L,),
              [cl.buffer(dy), cl.i64(dy.stride(0)), cl.buffer(dh), cl.i64(0 if dh is None else dh.stride(0)),
               cl.i32(dh is not None), cl.buffer(h), cl.i64(h.stride(0)), cl.buffer(w), cl.i32(w is not None),
               cl.buffer(rstd), bdx, bpart, cl.i64(M), cl.i64(N), cl.i64(per), cl.local_floats(L)],
              written=(bdx, bpart if part is not None else None))
    if dw is not None:
        bdw = cl.buffer(dw)
        cl.launch(prg, "rms_norm_dw", (-(-N // 8),), None, [bpart, cl.i64(G), cl.i64(N), bdw], written=(bdw,))
    return dx, dw
