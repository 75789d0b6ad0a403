"""Which contract-matrix cells of the edge-CPU backends (cpu:aarch64, cpu:riscv64) the default test
run keeps; the rest carry the ``cross`` marker (``pytest -m cross`` runs them all).

Every call of these backends is emulated (qemu-user) and crosses a pipe, ~0.1-3 s a cell on the
2-core VM, so the default run keeps a representative slice per target and vector length: every
op and dtype with its first case, and a fixed, hash-chosen sample of its cases: a quarter of the extreme-value cases
(in fp32: they test the kernels' arithmetic, not the conversions), a sixth of the layout cases
(strides reach the runner as spans) and a tenth of the others, ~40 cells per target.  ``large``
cases only run under the marker.
"""
from __future__ import annotations

import zlib

import torch


def in_default_slice(spec, dtype: torch.dtype, case) -> bool:
    if "large" in case.tags:
        return False
    if case is spec.cases[0]:
        return True
    h = zlib.crc32(f"{spec.name}/{str(dtype)}/{case.name}".encode())
    if "extreme" in case.tags:
        return dtype == torch.float32 and h % 4 == 0
    return h % (6 if "layout" in case.tags else 10) == 0
