"""linear_fp8 launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: linear_fp8.c, cross-compiled
into the remote runner; runtime: backends/cross.py).  Same entry point and arguments as cpu.py, one thread,
the portable C loops (no AVX512_BF16 dot products: the flag is 0)."""
from __future__ import annotations

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .._qlinear_int8.ref import ACT_CODE
from .cpu import _KIND, DTYPES  # noqa: F401
from .ref import scale_kind


def forward(x, weight, weight_scale, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0:
        return y
    rc = cross.call("tsr_linear_fp8", x, x.stride(0), weight, weight_scale, as_fp32_param(bias), y, M, N, K,
                    _KIND[scale_kind(weight_scale)], DTYPE_CODE[x.dtype], int(weight.dtype == torch.float8_e5m2),
                    ACT_CODE[activation], 0, 1)
    cross.check_rc(rc, "linear_fp8")
    return y


def backward(*args):
    raise NotImplementedError("linear_fp8 has no gradient (inference only)")
