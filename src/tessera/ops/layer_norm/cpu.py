"""LayerNorm native CPU launcher (kernel: layer_norm.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("layer_norm.c")


def _lib():
    return cpu.library("layer_norm", _SRC)


def forward(x, weight, bias, residual, eps):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    mean = new_output((M,), torch.float32, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, mean, rstd
    w, b = as_fp32_param(weight), as_fp32_param(bias)
    f = cpu.declare(_lib(), "tsr_layer_norm_fwd", "plplppppppllfiii")
    rc = f(cpu.ptr(x), x.stride(0), cpu.ptr(residual), 0 if residual is None else residual.stride(0),
           cpu.ptr(w), cpu.ptr(b), cpu.ptr(y), cpu.ptr(h), cpu.ptr(mean), cpu.ptr(rstd), M, N, eps,
           cpu.DTYPE_CODE[x.dtype], cpu.use_nt(y), cpu.threads_for(M * N))
    cpu.check_rc(rc, "layer_norm forward")
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
    f = cpu.declare(_lib(), "tsr_layer_norm_bwd", "plplplpppppplliii")
    rc = f(cpu.ptr(dy), dy.stride(0), cpu.ptr(dh), 0 if dh is None else dh.stride(0), cpu.ptr(h), h.stride(0),
           cpu.ptr(w), cpu.ptr(mean), cpu.ptr(rstd), cpu.ptr(dx), cpu.ptr(dw), cpu.ptr(db), M, N,
           cpu.DTYPE_CODE[h.dtype], cpu.use_nt(dx), cpu.threads_for(M * N))
    cpu.check_rc(rc, "layer_norm backward")
    return dx, dw, db
