"""LayerNorm launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: layer_norm.c,
cross-compiled into the remote runner; runtime: backends/cross.py).  Same C entry points and
arguments as cpu.py; tensors go to the runner as buffers, one thread, ordinary stores."""
from __future__ import annotations

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def forward(x, weight, bias, residual, eps):
    M, N = x.shape
    y = new_output((M, N), x.dtype, x.device)
    h = None if residual is None else new_output((M, N), x.dtype, x.device)
    mean = new_output((M,), torch.float32, x.device)
    rstd = new_output((M,), torch.float32, x.device)
    if M == 0:
        return y, h, mean, rstd
    w, b = as_fp32_param(weight), as_fp32_param(bias)
    rc = cross.call("tsr_layer_norm_fwd", x, x.stride(0), residual, 0 if residual is None else residual.stride(0),
                    w, b, y, h, mean, rstd, M, N, eps, DTYPE_CODE[x.dtype], 0, 1)
    cross.check_rc(rc, "layer_norm forward")
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
    rc = cross.call("tsr_layer_norm_bwd", dy, dy.stride(0), dh, 0 if dh is None else dh.stride(0), h, h.stride(0),
                    w, mean, rstd, dx, dw, db, M, N, DTYPE_CODE[h.dtype], 0, 1)
    cross.check_rc(rc, "layer_norm backward")
    return dx, dw, db
