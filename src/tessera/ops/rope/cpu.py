"""RoPE native CPU launcher (kernel: rope.c).  Interface: see ``ref.py``."""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("rope.c")
_POS_KIND = {None: 0, torch.int32: 1, torch.int64: 2}


# the kernel checks every position id against the tables (rc -2): the op skips its host check,
# a torch.aminmax per call (~30 us with the caches cold between a decode step's GEMMs)
CHECKS_POSITIONS = True


def _lib():
    return cpu.library("rope", _SRC)


def _run(q, k, cos, sin, pos, interleaved, rotary_dim, conj):
    B, S, Hq, D = q.shape
    Hk = k.shape[2]
    qo = new_output(q.shape, q.dtype, q.device)
    ko = new_output(k.shape, k.dtype, k.device)
    if B * S == 0 or Hq + Hk == 0:
        return qo, ko
    pb, ps = (0, 0) if pos is None else pos.stride()
    a = (ctypes.c_int64 * 17)(B, S, Hq, Hk, D, rotary_dim, cos.shape[0], *q.stride()[:3], *k.stride()[:3],
                              cos.stride(0), sin.stride(0), pb, ps)
    f = cpu.declare(_lib(), "tsr_rope", "ppppppppiiiiiii")
    rc = f(cpu.ptr(q), cpu.ptr(k), cpu.ptr(cos), cpu.ptr(sin), cpu.ptr(pos), cpu.ptr(qo), cpu.ptr(ko),
           ctypes.cast(a, ctypes.c_void_p), cpu.DTYPE_CODE[q.dtype], cpu.DTYPE_CODE[cos.dtype],
           _POS_KIND[None if pos is None else pos.dtype], int(interleaved), int(conj),
           cpu.use_nt(qo), cpu.threads_for(qo.numel() + ko.numel()))
    if rc == -2:  # nothing written to qo/ko, which are new: name the value as the host check would
        lo, hi = (int(v) for v in torch.aminmax(pos))
        raise ValueError(f"tessera.rope: argument 'position_ids' holds {lo if lo < 0 else hi}, outside "
                         f"[0, max_positions={cos.shape[0]}) of the cos/sin tables ({tuple(cos.shape)})")
    cpu.check_rc(rc, "rope " + ("backward" if conj else "forward"))
    return qo, ko


def forward(q, k, cos, sin, pos, interleaved, rotary_dim):
    return _run(q, k, cos, sin, pos, interleaved, rotary_dim, False)


def backward(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim):
    return _run(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim, True)
