"""Native CPU launchers of linear_w4a16 / linear_w4a8 (kernel: qlinear_int4.c).

``TESSERA_QLINEAR_INT4_FORCE_C=1`` (or ``force_c=True`` from the tests) runs the portable C
loops even in the AVX-512 build, so both code paths are checked against each other.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ... import dispatch
from ..._library import as_fp32_param, contiguous, new_output
from ...backends import cpu
from . import ACT_CODE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("qlinear_int4.c")
FORCE_C = [os.environ.get("TESSERA_QLINEAR_INT4_FORCE_C", "") == "1"]


def _lib():
    return cpu.library("qlinear_int4", _SRC)


_VENDOR = (dispatch.w4a16, dispatch.w4a8)
_KIND = ("w4a16", "w4a8")
_OP = ("linear_w4a16", "linear_w4a8")


def _forward(mode, x, weight, weight_scale, weight_zero, group_size, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    wdt = x.dtype if mode == 0 else torch.float32  # the vendor route's cached weight dtype
    if M and N and dispatch.use_vendor(_OP[mode], x.dtype, M, N, K, lambda: dispatch.cache_ok(
            _KIND[mode], weight, wdt, dispatch.int4_bytes(weight, wdt))):
        return _VENDOR[mode](x, weight, weight_scale, weight_zero, group_size, bias, activation)
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    w = contiguous(weight)
    s = contiguous(weight_scale)
    z = contiguous(weight_zero)
    b = as_fp32_param(bias)
    f = cpu.declare(_lib(), "tsr_qlinear_int4", "iplippppplllliii")
    rc = f(mode, cpu.ptr(x), x.stride(0), cpu.DTYPE_CODE[x.dtype], cpu.ptr(w), cpu.ptr(s), cpu.ptr(z), cpu.ptr(b),
           cpu.ptr(y), M, N, K, group_size, ACT_CODE[activation], cpu.threads_for(M * N * K // 8), int(FORCE_C[0]))
    cpu.check_rc(rc, "linear_w4a16" if mode == 0 else "linear_w4a8")
    return y


def forward_w4a16(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(0, x, weight, weight_scale, weight_zero, group_size, bias, activation)


def forward_w4a8(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(1, x, weight, weight_scale, weight_zero, group_size, bias, activation)
