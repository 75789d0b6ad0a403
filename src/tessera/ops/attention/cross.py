"""Attention launchers of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernels: attention_fwd.c /
attention_bwd.c with attn_tiles.c, cross-compiled into the remote runner; runtime: backends/cross.py).
Same entry points and arguments as cpu.py, one thread: the tiles are GCC vector extensions (64-byte
vectors), which the compilers lower to NEON / RVV registers."""
from __future__ import annotations

from ..._library import contiguous, new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .cpu import BWD_MODE, DTYPES, FWD_BLOCK_M  # noqa: F401

import torch


def forward(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, exact_lse=True):
    Tq, Hq, D = q.shape
    Hk = k.shape[1]
    out = new_output((Tq, Hq, D), q.dtype, q.device)
    lse = new_output((Hq, Tq), torch.float32, q.device)
    B = cu_q.shape[0] - 1
    if Tq == 0 or Hq == 0 or B == 0:
        return out, lse
    rc = cross.call("tsr_attn_fwd", q, q.stride(0), q.stride(1), k, k.stride(0), k.stride(1), v, v.stride(0),
                    v.stride(1), cu_q, cu_k, B, Hq, Hk, D, scale, window_left, window_right, softcap, out, lse,
                    DTYPE_CODE[q.dtype], FWD_BLOCK_M, 1)
    cross.check_rc(rc, "attention forward")
    return out, lse


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap):
    Tq, Hq, D = q.shape
    Tk, Hk = k.shape[0], k.shape[1]
    dq = new_output(q.shape, q.dtype, q.device)
    dk = new_output(k.shape, k.dtype, k.device)
    dv = new_output(v.shape, v.dtype, v.device)
    B = cu_q.shape[0] - 1
    if B == 0 or Hq == 0 or (Tq == 0 and Tk == 0):
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:
        dout = contiguous(dout)
    rc = cross.call("tsr_attn_bwd", dout, dout.stride(0), dout.stride(1), q, q.stride(0), q.stride(1), k,
                    k.stride(0), k.stride(1), v, v.stride(0), v.stride(1), out, out.stride(0), out.stride(1), lse,
                    cu_q, cu_k, B, Hq, Hk, D, scale, window_left, window_right, softcap, dq, dk, dv,
                    DTYPE_CODE[q.dtype], BWD_MODE, 1)
    cross.check_rc(rc, "attention backward")
    return dq, dk, dv
