"""RMSNorm native CPU launcher (kernel: rms_norm.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("rms_norm.c")


def _lib():
    return cpu.library("rms_norm", _SRC)


def forward(x, weight, residual, eps):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, rstd
    w = as_fp32_param(weight)
    f = cpu.declare(_lib(), "tsr_rms_norm_fwd", "plplppppllfiii")
    rc = f(cpu.ptr(x), x.stride(0), cpu.ptr(residual), 0 if residual is None else residual.stride(0),
           cpu.ptr(w), cpu.ptr(y), cpu.ptr(h), cpu.ptr(rstd), M, N, eps, cpu.DTYPE_CODE[x.dtype],
           cpu.use_nt(y), cpu.threads_for(M * N))
    cpu.check_rc(rc, "rms_norm forward")
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
    f = cpu.declare(_lib(), "tsr_rms_norm_bwd", "plplplpppplliii")
    rc = f(cpu.ptr(dy), dy.stride(0), cpu.ptr(dh), 0 if dh is None else dh.stride(0), cpu.ptr(h), h.stride(0),
           cpu.ptr(w), cpu.ptr(rstd), cpu.ptr(dx), cpu.ptr(dw), M, N, cpu.DTYPE_CODE[h.dtype],
           cpu.use_nt(dx), cpu.threads_for(M * N))
    cpu.check_rc(rc, "rms_norm backward")
    return dx, dw
