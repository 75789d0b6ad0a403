"""Attention launchers of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernels: attention_fwd.c /
attention_bwd.c with attn_tiles.c, cross-compiled into the remote runner; runtime: backends/cross.py).
cpu.py's launchers with the runner's call in place of the in-process one, one thread: the tiles are GCC
vector extensions (64-byte vectors), which the compilers lower to NEON / RVV registers."""
from __future__ import annotations

from ...backends import cross
from . import cpu as _cpu
from .cpu import DTYPES  # noqa: F401


def _launch(name, work, *args):
    return cross.call(name, *args, 1)


def forward(*args):
    return _cpu.forward(*args, launch=_launch, check_rc=cross.check_rc)


def backward(*args):
    return _cpu.backward(*args, launch=_launch, check_rc=cross.check_rc)
