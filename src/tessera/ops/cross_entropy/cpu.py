"""Cross-entropy native CPU launcher (kernel: cross_entropy.c; contract: glue.py)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu
from . import glue

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("cross_entropy.c")


def _lib():
    return cpu.library("cross_entropy", _SRC)


def loss_rows(x, target, ignore_index, label_smoothing, z_loss, softcap, dx=None, scale=1.0, row_scale=None):
    M, N = x.shape
    loss = new_output((M,), torch.float32, x.device)
    lse = new_output((M,), torch.float32, x.device)
    if M == 0:
        return loss, lse
    f = cpu.declare(_lib(), "tsr_cross_entropy_fwd", "plplfffplfplpplliii")
    rc = f(cpu.ptr(x), x.stride(0), cpu.ptr(target), ignore_index, label_smoothing, z_loss, softcap,
           cpu.ptr(row_scale), 0 if row_scale is None else row_scale.stride(0), scale,
           cpu.ptr(dx), 0 if dx is None else dx.stride(0), cpu.ptr(loss), cpu.ptr(lse), M, N,
           cpu.DTYPE_CODE[x.dtype], 0 if dx is None else cpu.use_nt(dx), cpu.threads_for(M * N))
    if rc == cpu.EINVAL:  # glue.targets() checked them: only a direct caller can get here
        raise ValueError("tessera.cross_entropy: a target is outside [0, V) and not ignore_index")
    cpu.check_rc(rc, "cross_entropy forward")
    return loss, lse


def count_targets(t, V, ignore_index):
    """(M,) contiguous int64 targets -> the number not ignored, or None when one is outside [0, V)
    (then glue.targets' torch check names it)."""
    n = ctypes.c_int64()
    f = cpu.declare(_lib(), "tsr_cross_entropy_targets", "plllp")
    rc = f(cpu.ptr(t), t.shape[0], ignore_index, V, ctypes.addressof(n))
    return None if rc == cpu.EINVAL else n.value


def forward(x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad):
    return glue.forward(loss_rows, x, target, ignore_index, label_smoothing, z_loss, softcap, reduction, want_grad,
                        count=count_targets)


def backward(d, g):
    M, N = d.shape
    dx = new_output((M, N), d.dtype, d.device)
    if M == 0:
        return dx
    f = cpu.declare(_lib(), "tsr_cross_entropy_bwd", "plplplliii")
    rc = f(cpu.ptr(d), d.stride(0), cpu.ptr(g), g.stride(0), cpu.ptr(dx), M, N, cpu.DTYPE_CODE[d.dtype],
           cpu.use_nt(dx), cpu.threads_for(M * N))
    cpu.check_rc(rc, "cross_entropy backward")
    return dx
