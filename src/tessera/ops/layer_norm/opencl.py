"""LayerNorm opencl launcher (kernel: layer_norm.cl; runtime: backends/opencl.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cpu, opencl as cl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("layer_norm.cl")


def _prg(dtype, out):
    # TSR_NT: streaming stores of `out` (tessera_cl.h), at the cpu backend's size threshold
    return cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[dtype], "TSR_NT": cpu.use_nt(out)})


def forward(x, weight, bias, residual, eps):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    mean = new_output((M,), torch.float32, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, mean, rstd
    w, b = as_fp32_param(weight), as_fp32_param(bias)
    L = cl.vec_local_size(N)
    by, bh, bm, br = cl.buffer(y), cl.buffer(h), cl.buffer(mean), cl.buffer(rstd)
    args = [cl.buffer(x), cl.i64(x.stride(0)), cl.buffer(residual), cl.i64(0 if residual is None else residual.stride(0)),
            cl.i32(residual is not None), cl.buffer(w), cl.i32(w is not None), cl.buffer(b), cl.i32(b is not None),
            by, bh, bm, br, cl.i64(M), cl.i64(N), cl.f32(eps), cl.local_floats(L)]
    # one row per work-group: the groups are the device's unit of load balance
    cl.launch(_prg(x.dtype, y), "layer_norm_fwd", (M * L,), (L,), args,
              written=(by, bh if h is not None else None, bm, br))
    return y, h, mean, rstd


def backward(dy, dh, h, weight, bias, mean, rstd, eps):
    M, N = h.shape
    dx = new_output((M, N), h.dtype, h.device)
    dw = None if weight is None else new_output((N,), torch.float32, h.device)
    db = None if bias is None else new_output((N,), torch.float32, h.device)
    if M == 0:
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return dx, dw, db
    w = as_fp32_param(weight)
    L = cl.vec_local_size(N)
    G = cl.row_groups(M)
    per = -(-M // G)
    G = -(-M // per)
    want = dw is not None or db is not None
    part = new_output((G, 2, N), torch.float32, h.device) if want else None  # (dw, db) partial rows per group
    prg = _prg(h.dtype, dx)
    bpart, bdx = cl.buffer(part), cl.buffer(dx)
    cl.launch(prg, "layer_norm_bwd", (G * L,), (L,),
              [cl.buffer(dy), cl.i64(dy.stride(0)), cl.buffer(dh), cl.i64(0 if dh is None else dh.stride(0)),
               cl.i32(dh is not None), cl.buffer(h), cl.i64(h.stride(0)), cl.buffer(w), cl.i32(w is not None),
               cl.buffer(mean), cl.buffer(rstd), bdx, bpart, cl.i32(want), cl.i64(M), cl.i64(N), cl.i64(per),
               cl.local_floats(L)],
              written=(bdx, bpart if want else None))
    if want:
        bdw, bdb = cl.buffer(dw), cl.buffer(db)
        cl.launch(prg, "layer_norm_dwdb", (-(-N // 8),), None,
                  [bpart, cl.i64(G), cl.i64(N), bdw, cl.i32(dw is not None), bdb, cl.i32(db is not None)],
                  written=(bdw if dw is not None else None, bdb if db is not None else None))
    return dx, dw, db
