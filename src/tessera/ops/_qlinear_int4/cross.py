"""Launchers of linear_w4a16 / linear_w4a8 on the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel:
qlinear_int4.c, cross-compiled into the remote runner; runtime: backends/cross.py).  The same entry point
and arguments as cpu.py, one thread, the portable C loops (unit-stride runs the compilers vectorise for
NEON / RVV); no vendor route (``dispatch``).  AArch64 W4A8 runs its int8 dots with SDOT where the CPU has
it (run-time choice in the runner); ``TESSERA_QI8_DOT=0`` forces the plain loops (``force_c``), as for the
int8 matmuls (_qlinear_int8/cross.py)."""
from __future__ import annotations

from ..._library import as_fp32_param, contiguous, new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .._qlinear_int8.cross import dot_level
from . import ACT_CODE
from .cpu import DTYPES  # noqa: F401


def _forward(mode, x, weight, weight_scale, weight_zero, group_size, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    rc = cross.call("tsr_qlinear_int4", mode, x, x.stride(0), DTYPE_CODE[x.dtype], contiguous(weight),
                    contiguous(weight_scale), contiguous(weight_zero), as_fp32_param(bias), y, M, N, K, group_size,
                    ACT_CODE[activation], 1, int(dot_level() == 0))
    cross.check_rc(rc, "linear_w4a16" if mode == 0 else "linear_w4a8")
    return y


def forward_w4a16(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(0, x, weight, weight_scale, weight_zero, group_size, bias, activation)


def forward_w4a8(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    return _forward(1, x, weight, weight_scale, weight_zero, group_size, bias, activation)
