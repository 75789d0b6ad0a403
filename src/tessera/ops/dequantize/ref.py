"""dequantize_blocks reference (float64) and the ``reference`` backend's kernel.

    out = dtype(fp32((q - zero) * scale))      zero: the uint8 zero point of the block, 8 for
                                               symmetric 4-bit codes, 0 for int8/int16/fp8

q is the decoded code: int8 / int16 values, 4-bit offset-binary codes unpacked from bytes
(byte j = c[2j] | c[2j+1] << 4), or the fp8 value.  (q - zero) is exact; the product is one
correctly rounded fp32 multiply, then one rounding to the output dtype: every backend computes
exactly this, so dequantised values agree bit for bit across backends (the matrix still judges
them against the float64 product with the float rules).
"""
from __future__ import annotations

import torch

from ..quantize.ref import _expand, grid, unpack_nibbles

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DATA_DTYPES = (torch.int8, torch.int16, torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz)


def _codes_and_blocks(data, scale, zero, block_rows, block, up):
    q = unpack_nibbles(data) if data.dtype == torch.uint8 else data
    K = q.shape[-1]
    q2 = q.reshape(-1, K)
    M = q2.shape[0]
    br, bc, Mb, Kb = grid(M, K, block_rows, block)
    s = _expand(scale.reshape(Mb, Kb).to(up), br, bc, M, K)
    if zero is not None:
        z = _expand(zero.reshape(Mb, Kb).to(up), br, bc, M, K)
    else:
        z = torch.full((), 8.0 if data.dtype == torch.uint8 else 0.0, dtype=up)
    return q2.to(up), s, z, q.shape


def dequantize_blocks_ref(data, scale, zero=None, block_rows=1, block=0, dtype=None):
    """Float64 (q - zero) * scale, shaped like the codes (4-bit codes unpacked)."""
    q, s, z, shape = _codes_and_blocks(data, scale, zero, block_rows, block, torch.float64)
    return ((q - z) * s).reshape(shape)


def dequantize_blocks_eager(data, scale, zero=None, block_rows=1, block=0, dtype=None):
    """The contract in plain PyTorch: fp32 (q - zero) * scale, then cast to ``dtype`` (default:
    the scale's dtype)."""
    q, s, z, shape = _codes_and_blocks(data, scale, zero, block_rows, block, torch.float32)
    return ((q - z) * s).to(scale.dtype if dtype is None else dtype).reshape(shape)


# ---------------------------------------------------------------- reference backend kernel

def launch_plan(data, block_rows, block, dtype):
    """What the native and Triton launchers start from: M, K (unpacked values per row), the
    block grid (br, bc, Kb), the empty (M, K) output and the codes as integers (fp8 viewed as
    its uint8 bits, which both kernels decode with integer operations)."""
    from ..._library import new_output
    M = data.shape[0]
    K = data.shape[1] * (2 if data.dtype == torch.uint8 else 1)
    br, bc, _, Kb = grid(M, K, block_rows, block)
    q = data.view(torch.uint8) if data.dtype.is_floating_point else data
    return M, K, (br, bc, Kb), new_output((M, K), dtype, data.device), q


def forward(data2, scale, zero, block_rows, block, dtype):
    return dequantize_blocks_eager(data2, scale, zero, block_rows, block, dtype)


def backward(*args):
    raise NotImplementedError("dequantize_blocks has no gradient")
