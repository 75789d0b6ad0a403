"""Launchers of the int8 matmuls on the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: qlinear_int8.c,
cross-compiled into the remote runner; runtime: backends/cross.py).  The same entry point and arguments as
cpu.py's ``_run``, one thread; no vendor route (``dispatch``).  RVV: the portable C micro-kernels, which the
compiler vectorises.  AArch64: int8 blocks run SDOT / SMMLA micro-kernels where the CPU has them (chosen in
the runner from getauxval's HWCAP bits), else the portable ones (NEON smull/sadalp).  Integer sums are exact
(int32 modulo 2^32), so results are bit-identical with every other backend.

``TESSERA_QI8_DOT`` picks among them (tests use it to prove the paths bit-exact with each other):
``0`` = the plain NEON code, ``sdot`` = SDOT even where SMMLA exists, unset / anything else = the best the
CPU has.  The value reaches the kernel as its ``vnni_ok`` argument (0 / 2 / 1), read at each call."""
from __future__ import annotations

import torch

from ... import _env
from ..._library import new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .ref import ACT_CODE

_INT_KIND = {torch.int8: 8, torch.int16: 16}


def dot_level() -> int:
    """``TESSERA_QI8_DOT`` as tsr_qi8_mm's ``vnni_ok``: 0 plain NEON, 2 at most SDOT, 1 the best."""
    v = _env.get("TESSERA_QI8_DOT", "").strip().lower()
    return 0 if v in ("0", "neon") else 2 if v in ("sdot", "dotprod") else 1


def _run(x, xkind, bits, weight, sw, bias, act, y, ydtype):
    M, K = x.shape
    N = weight.shape[0]
    if M == 0 or N == 0:
        return y
    rc = cross.call("tsr_qi8_mm", x, x.stride(0), xkind, bits, M, K, weight, N, sw, bias, ACT_CODE[act], y, ydtype,
                    dot_level(), 1)
    cross.check_rc(rc, "int8 matmul")
    return y


def int_mm_forward(a, b):
    """a [M, K] int8/int16 row view (unit inner stride), b [N, K] int8 contiguous."""
    y = new_output((a.shape[0], b.shape[0]), torch.int32 if a.dtype == torch.int8 else torch.int64, a.device)
    return _run(a, _INT_KIND[a.dtype], _INT_KIND[a.dtype], b, None, None, None, y, -1)


def linear_forward(x, weight, sw, bias, activation, bits):
    y = new_output((x.shape[0], weight.shape[0]), x.dtype, x.device)
    return _run(x, DTYPE_CODE[x.dtype], bits, weight, sw, bias, activation, y, DTYPE_CODE[x.dtype])
