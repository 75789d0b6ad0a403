"""RoPE launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: rope.c, cross-compiled into
the remote runner; runtime: backends/cross.py).  cpu.py's launcher with the runner's call in place of the
in-process one: the 17 sizes and strides travel as an int64 buffer; one thread, ordinary stores.  The
kernel checks every position id itself (rc -2), as on the cpu backend."""
from __future__ import annotations

import torch

from ...backends import cross
from . import cpu as _cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHECKS_POSITIONS = True


def _launch(q, k, cos, sin, pos, qo, ko, sizes, codes):
    return cross.call("tsr_rope", q, k, cos, sin, pos, qo, ko, torch.tensor(sizes, dtype=torch.int64), *codes, 0, 1)


def forward(q, k, cos, sin, pos, interleaved, rotary_dim):
    return _cpu._run(q, k, cos, sin, pos, interleaved, rotary_dim, False, _launch, cross.check_rc)


def backward(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim):
    return _cpu._run(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim, True, _launch, cross.check_rc)
