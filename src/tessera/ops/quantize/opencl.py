"""quantize_blocks opencl launcher (kernel: quantize.cl; runtime: backends/opencl.py).

block_rows == 1 (per row / token / channel / group): one launch, ``quant_rows``.  Other
blocks (per tensor, 2-D blocks) and 4-bit codes over odd blocks: ``quant_stats`` (per row and column block) into an fp32
workspace, ``quant_merge`` (per scale block, rows in order), ``quant_codes``.  An empty x
launches only the merge, which writes a per-tensor scale.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import opencl as cl
from .cpu import KIND
from .ref import QTYPES, grid

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("quantize.cl")
SEQ_MAX_BLOCK = 1024


def row_local_size(K: int) -> int:
    """Work-items of a one-work-group-per-row quantisation kernel.  CPU devices: 8 (PoCL runs a
    work-group on one core, so more work-items only add passes through the reduction's barriers:
    the per-row statistics ran ~1.5x faster than with 256); other devices: runtime's
    row_local_size.  Never below 8: PoCL 3.0's compiler fails on some of these kernels at 1-2."""
    import pyopencl  # the runtime has imported it already
    rt = cl.runtime()
    t = rt.device.type
    L = 8 if (t & pyopencl.device_type.CPU) and not (t & pyopencl.device_type.GPU) else cl.row_local_size(K)
    return min(max(L, 8), rt.max_wg)


def _prg(dtype, qtype):
    return cl.program(_SRC, {"TSR_DTYPE": cl.DTYPE_CODE[dtype], "QKIND": KIND[qtype]})


def forward(x, qtype, block_rows, block):
    M, K = x.shape
    br, bc, Mb, Kb = grid(M, K, block_rows, block)
    dt, _, packed = QTYPES[qtype]
    codes = new_output((M, K // 2 if packed else K), dt, x.device)
    scale = new_output((Mb, Kb), torch.float32, x.device)
    zero = new_output((Mb, Kb), torch.uint8, x.device) if qtype == "int4_zp" else None
    if scale.numel() == 0:
        return codes, scale, zero
    prg = _prg(x.dtype, qtype)
    L = row_local_size(K)
    seq = int(Kb > 1 and bc <= SEQ_MAX_BLOCK)   # small blocks: one work-item per block
    odd4 = packed and bc % 2 == 1                # a byte's two codes in two blocks
    bcodes = cl.buffer(codes.view(torch.uint8) if dt.is_floating_point else codes)
    bscale, bzero = cl.buffer(scale), cl.buffer(zero)
    zw = bzero if zero is not None else None
    geo = [cl.i64(K), cl.i64(bc), cl.i64(Kb)]
    if M and br == 1 and not odd4:
        cl.launch(prg, "quant_rows", (M * L,), (L,),
                  [cl.buffer(x), cl.i64(x.stride(0)), *geo, cl.i32(seq), bcodes, bscale, bzero, cl.local_floats(L)],
                  written=(bcodes, bscale, zw))
        return codes, scale, zero
    st = new_output((M * Kb * 2,), torch.float32, x.device) if M else None
    bst = cl.buffer(st)
    bx = cl.buffer(x)
    if M:
        cl.launch(prg, "quant_stats", (M * L,), (L,),
                  [bx, cl.i64(x.stride(0)), *geo, cl.i32(seq), bst, cl.local_floats(L)], written=(bst,))
    n = Mb * Kb
    cl.launch(prg, "quant_merge", (cl.round_up(n, 64),), None,
              [bst, cl.i64(M), cl.i64(br), cl.i64(Mb), cl.i64(Kb), bscale, bzero], written=(bscale, zw))
    if M:
        cl.launch(prg, "quant_codes", (M * L,), (L,),
                  [bx, cl.i64(x.stride(0)), *geo, cl.i64(br), cl.i32(2 if odd4 else 0 if seq else 1), bcodes, bscale,
                   bzero], written=(bcodes,))
    return codes, scale, zero


def backward(*args):
    raise NotImplementedError("quantize_blocks has no gradient")
