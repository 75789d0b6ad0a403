"""add_int8 native CPU kernel module (add_int8.c: int8 codes by table lookups with AVX-512 VBMI, 16
lanes a step with AVX-512 otherwise, tessera_requant.h's MBQM; the portable C on the other ISA
levels).  ``TESSERA_ADD_INT8_TABLE=0`` turns the lookups off (tests compare both paths)."""
from __future__ import annotations

from pathlib import Path

import torch

from ... import _env
from ..._library import new_output
from ...backends import cpu
from .ref import DTYPES  # noqa: F401

_SRC = Path(__file__).with_name("add_int8.c")


def forward(a, b, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift, out_multiplier,
            out_shift, out_zero_point, qmin, qmax, left_shift):
    """a, b: flat contiguous codes of one length -> flat codes of a's dtype."""
    n = a.numel()
    out = new_output((n,), a.dtype, a.device)
    if n:
        f = cpu.declare(cpu.library("add_int8", _SRC), "tsr_add_int8", "ppli" + "i" * 13 + "pi")
        rc = f(cpu.ptr(a), cpu.ptr(b), n, 16 if a.dtype == torch.int16 else 8, a_zero_point, a_multiplier, a_shift,
               b_zero_point, b_multiplier, b_shift, out_multiplier, out_shift, out_zero_point, qmin, qmax, left_shift,
               int(_env.get("TESSERA_ADD_INT8_TABLE", "1") != "0"), cpu.ptr(out), cpu.threads_for(n))
        cpu.check_rc(rc, "add_int8")
    return out


def backward(*args):
    raise NotImplementedError("add_int8 has no gradient (integer op)")
