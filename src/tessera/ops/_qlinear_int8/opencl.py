"""opencl launchers of the int8 matmuls (kernel: qlinear_int8.cl; runtime: backends/opencl.py).

int_mm runs the matmul on a and w directly; the linears first quantise x per row into an int8 /
int16 workspace (``qi8_quant_rows``, the integer contract) and the matmul applies the fp32
epilogue.  Matmul kernels by device: GPUs (qlinear_int8_tiled.cl) ``qi8_mm``, the local-memory
tiled GEMM, or ``qi8_gemv`` (M <= GEMV_MAX_M: coalesced weight reads, work-group reductions);
other devices (qlinear_int8.cl) ``qi8_dot11`` (M <= 2) / ``qi8_dot24``, per-work-item dot
products along K that a CPU compiler vectorises (PoCL runs the tiled GEMM ~10x slower).
``PATH[0]`` ("gpu" / "cpu" / None = by device type) lets the tests run both families on any
device.  All give the same integers; no backward (inference ops).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import opencl as cl
from ..quantize.opencl import row_local_size
from .ref import ACT_CODE, DTYPES, INT_DTYPES  # noqa: F401

_SRC = Path(__file__).with_name("qlinear_int8.cl")              # activations + CPU-device matmuls
_SRC_TILED = Path(__file__).with_name("qlinear_int8_tiled.cl")  # GPU matmuls
GEMV_MAX_M = 8   # decode sizes: the weight is read once per work-group, x rows from cache
GEMV_L = 64      # work-items per GEMV work-group (NR = 4 weight rows each)
NR = 4
PATH = [None]


def _path() -> str:
    """"gpu" (tiled GEMM / GEMV) on a device that says it is a GPU, else "cpu" (dot products);
    ``PATH[0]`` overrides (tests run both families on any device)."""
    if PATH[0]:
        return PATH[0]
    import pyopencl  # the runtime has imported it already
    return "gpu" if cl.runtime().device.type & pyopencl.device_type.GPU else "cpu"


def dot_grid(M: int, N: int, dr: int, dc: int):
    """(global, local) sizes of a dot-product kernel (dimension 0: blocks of dr rows, 1: blocks of
    dc weight rows).  A work-group spans up to 16 row blocks for its 64 / 16+ weight-row blocks, so
    the weight is streamed from memory once per 16 * dr rows of x, not once per row."""
    rb, cb = -(-M // dr), -(-N // dc)
    lr = 1
    while lr < min(rb, 16):
        lr <<= 1
    lc = max(1, min(64, cl.runtime().max_wg) // lr)
    return (cl.round_up(rb, lr), cl.round_up(cb, lc)), (lr, lc)


def _tile_w() -> int:
    """Work-group side of the GEMM (W x W work-items, a 4W x 4W output tile), within the device limit."""
    mx = cl.runtime().max_wg
    return 16 if mx >= 256 else 8 if mx >= 64 else 4


def _prg(bits, out_dtype, tiled=False):
    out_int = out_dtype in (torch.int32, torch.int64)
    defs = {"ABITS": bits, "OUT_INT": int(out_int), "TSR_DTYPE": 0 if out_int else cl.DTYPE_CODE[out_dtype]}
    return cl.program(_SRC_TILED, {**defs, "W": _tile_w()}) if tiled else cl.program(_SRC, defs)


def _mm(a, bits, weight, sx, sw, bias, act, y):
    """y = epilogue(a @ weight.T): a [M, K] int8/int16 row view, weight [N, K] int8 contiguous."""
    M, K = a.shape
    N = weight.shape[0]
    path = _path()
    prg = _prg(bits, y.dtype, tiled=path == "gpu")
    by = cl.buffer(y)
    args = [cl.buffer(a), cl.i64(a.stride(0)), cl.buffer(weight), cl.i64(M), cl.i64(N), cl.i64(K),
            cl.buffer(sx), cl.buffer(sw), cl.buffer(bias), cl.i32(bias is not None), cl.i32(ACT_CODE[act]), by]
    if path == "cpu":
        dr, dc = (1, 1) if M <= 2 else (2, 4)
        cl.launch(prg, f"qi8_dot{dr}{dc}", *dot_grid(M, N, dr, dc), args, written=(by,))
    elif M <= GEMV_MAX_M:
        L = min(GEMV_L, cl.runtime().max_wg)
        groups = -(-N // NR)
        cl.launch(prg, "qi8_gemv", (groups * L,), (L,), args + [cl.local_floats(2 * NR * L)], written=(by,))
    else:
        W = _tile_w()
        T = 4 * W
        cl.launch(prg, "qi8_mm", (-(-N // T) * W, -(-M // T) * W), (W, W), args, written=(by,))
    return y


def int_mm_forward(a, b):
    """a [M, K] int8/int16 row view (unit inner stride), b [N, K] int8 contiguous."""
    out_dtype = torch.int32 if a.dtype == torch.int8 else torch.int64
    y = new_output((a.shape[0], b.shape[0]), out_dtype, a.device)
    if y.numel() == 0:
        return y
    return _mm(a, 8 if a.dtype == torch.int8 else 16, b, None, None, None, None, y)


def quantize_rows(x, bits):
    """(q [M, K] int8/int16, fp32 scales [M]) of a float row view, per the integer contract."""
    M, K = x.shape
    q = new_output((M, K), torch.int8 if bits == 8 else torch.int16, x.device)
    sx = new_output((M,), torch.float32, x.device)
    prg = _prg(bits, x.dtype)   # TSR_DTYPE = x's dtype: the row loads
    L = row_local_size(K)
    bq, bs = cl.buffer(q), cl.buffer(sx)
    cl.launch(prg, "qi8_quant_rows", (M * L,), (L,),
              [cl.buffer(x), cl.i64(x.stride(0)), cl.i64(K), bq, bs, cl.local_floats(L)], written=(bq, bs))
    return q, sx


def linear_forward(x, weight, sw, bias, activation, bits):
    """x [M, K] float row view, weight [N, K] int8, sw fp32 [N], bias fp32 [N] or None."""
    M = x.shape[0]
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if y.numel() == 0:
        return y
    q, sx = quantize_rows(x, bits)
    return _mm(q, bits, weight, sx, sw, bias, activation, y)
