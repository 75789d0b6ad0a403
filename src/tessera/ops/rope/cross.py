"""RoPE launcher of the edge-CPU backends cpu:aarch64 / cpu:riscv64 (kernel: rope.c, cross-compiled into
the remote runner; runtime: backends/cross.py).  Same C entry point and arguments as cpu.py (the 17
sizes and strides travel as an int64 buffer); one thread, ordinary stores.  The kernel checks every
position id itself (rc -2), as on the cpu backend."""
from __future__ import annotations

import torch

from ..._library import new_output
from ...backends import cross
from ...backends.cpu import DTYPE_CODE
from .cpu import _POS_KIND

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CHECKS_POSITIONS = True


def _run(q, k, cos, sin, pos, interleaved, rotary_dim, conj):
    B, S, Hq, D = q.shape
    Hk = k.shape[2]
    qo = new_output(q.shape, q.dtype, q.device)
    ko = new_output(k.shape, k.dtype, k.device)
    if B * S == 0 or Hq + Hk == 0:
        return qo, ko
    pb, ps = (0, 0) if pos is None else pos.stride()
    a = torch.tensor([B, S, Hq, Hk, D, rotary_dim, cos.shape[0], *q.stride()[:3], *k.stride()[:3],
                      cos.stride(0), sin.stride(0), pb, ps], dtype=torch.int64)
    rc = cross.call("tsr_rope", q, k, cos, sin, pos, qo, ko, a, DTYPE_CODE[q.dtype], DTYPE_CODE[cos.dtype],
                    _POS_KIND[None if pos is None else pos.dtype], int(interleaved), int(conj), 0, 1)
    if rc == -2:
        lo, hi = (int(v) for v in torch.aminmax(pos))
        raise ValueError(f"tessera.rope: argument 'position_ids' holds {lo if lo < 0 else hi}, outside "
                         f"[0, max_positions={cos.shape[0]}) of the cos/sin tables ({tuple(cos.shape)})")
    cross.check_rc(rc, "rope " + ("backward" if conj else "forward"))
    return qo, ko


def forward(q, k, cos, sin, pos, interleaved, rotary_dim):
    return _run(q, k, cos, sin, pos, interleaved, rotary_dim, False)


def backward(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim):
    return _run(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim, True)
