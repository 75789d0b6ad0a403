"""RoPE opencl launcher (kernel: rope.cl; runtime: backends/opencl.py).  Interface: see ``ref.py``."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu, opencl as cl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("rope.cl")
_POS_KIND = {None: 0, torch.int32: 1, torch.int64: 2}


def _f64_lanes() -> bool:
    """fp32 rotations in float64 lanes (see rope.cl): on a CPU device with cl_khr_fp64, outside
    TESSERA_OPENCL_PORTABLE.  GPUs keep fma (native there; float64 is slow or absent)."""
    rt = cl.runtime()
    v = rt.__dict__.get("_tsr_rope_f64")
    if v is None:
        v = rt._tsr_rope_f64 = bool(rt.device.type & cl._cl().device_type.CPU) and "cl_khr_fp64" in rt.extensions
    return v and not cl.portable()


def _launch(x, out, cos, sin, pos, interleaved, r, sign, berr):
    B, S, H, D = x.shape
    T = B * S
    if T == 0 or H == 0:
        return
    prg = cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[x.dtype], "ROPE_CS_F32": int(cos.dtype == torch.float32),
                            "ROPE_POS": _POS_KIND[None if pos is None else pos.dtype],
                            "ROPE_F64": int(x.dtype == torch.float32 and _f64_lanes()),
                            "TSR_NT": cpu.use_nt(out)})  # streaming stores of out (tessera_cl.h)
    pairs_per_chunk = 4 if interleaved else 8
    units = H * -(-(r // 2) // pairs_per_chunk)          # (head, chunk) units of one token
    L = cl.vec_local_size(8 * units)
    pb, ps = (0, 0) if pos is None else pos.stride()
    bo = cl.buffer(out)
    # one token per work-group
    cl.launch(prg, "rope_run", (T * L,), (L,),
              [cl.buffer(x), cl.i64(x.stride(0)), cl.i64(x.stride(1)), cl.i64(x.stride(2)), bo,
               cl.buffer(cos), cl.buffer(sin), cl.i64(cos.stride(0)), cl.i64(sin.stride(0)),
               cl.buffer(pos), cl.i64(pb), cl.i64(ps), cl.i64(S), cl.i64(T), cl.i64(H), cl.i64(D),
               cl.i64(r), cl.i64(cos.shape[0]), cl.i32(int(interleaved)), cl.f32(sign), berr],
              written=(bo, berr))


def _run(q, k, cos, sin, pos, interleaved, rotary_dim, sign):
    qo = new_output(q.shape, q.dtype, q.device)
    ko = new_output(k.shape, k.dtype, k.device)
    if q.shape[0] * q.shape[1] == 0:
        return qo, ko
    # the kernel's own bounds check on position ids (the host checked them already): never a wild read
    err = torch.zeros(1, dtype=torch.int32)
    berr = cl.buffer(err)
    _launch(q, qo, cos, sin, pos, interleaved, rotary_dim, sign, berr)
    _launch(k, ko, cos, sin, pos, interleaved, rotary_dim, sign, berr)
    if int(err[0]):
        raise ValueError(f"tessera.rope: a position id is outside [0, max_positions={cos.shape[0]}) "
                         "of the cos/sin tables (opencl kernel)")
    return qo, ko


def forward(q, k, cos, sin, pos, interleaved, rotary_dim):
    return _run(q, k, cos, sin, pos, interleaved, rotary_dim, 1.0)


def backward(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim):
    return _run(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim, -1.0)
