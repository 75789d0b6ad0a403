"""quantize_blocks reference: the integer contract (``tessera.quant.contract``) over scale blocks,
and the ``reference`` backend's kernel.

x [..., K] is viewed as rows [M, K]; scale block (bi, bj) covers rows [bi*br, bi*br + br) and
columns [bj*bc, bj*bc + bc) (edge blocks are partial).  Per kind (``QTYPES``):

    int8 / int16 / int4 / fp8_*   scale = max(amax, 1e-12) / QMAX   (contract.scale_for; QMAX 240
                                  for fp8_e4m3fnuz, which is not in the contract's table)
    int4_zp                       contract.quantize_asym_int4 over the block: scale, zero
    q4_0                          m = the first (row-major) entry of largest |x| (NaN as 0),
                                  scale = copysign(max(|m|, 1e-12), m) / -8   (ggml's rule: the
                                  largest-magnitude value maps to code 0, i.e. q = -8)

then codes = contract.quantize_values(x, scale) (int4 / q4_0: offset binary 0..15) or, with a
zero point, saturate(rint(nan0(x / scale)) + zero, 0, 15).  4-bit codes are packed two per
byte along K (byte j = code[2j] | code[2j+1] << 4).  Everything is fp32 math on the exact
upcast of the input: this module *is* the contract, so every backend must equal it bit for bit.
"""
from __future__ import annotations

import torch

from ...quant import contract

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# name -> (code dtype, contract qtype key, packed 4-bit)
QTYPES = {
    "int8": (torch.int8, torch.int8, False),
    "int16": (torch.int16, torch.int16, False),
    "int4": (torch.uint8, "int4", True),
    "int4_zp": (torch.uint8, "int4", True),
    "q4_0": (torch.uint8, "int4", True),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.float8_e4m3fn, False),
    "fp8_e5m2": (torch.float8_e5m2, torch.float8_e5m2, False),
    "fp8_e4m3fnuz": (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz, False),
}
# AMD's e4m3fnuz (bias 8, max 240, one NaN code 0x80, no -0, no inf) is not in the shared
# contract table; it follows the same fp8 rule with QMAX = 240.
FNUZ_QMAX = 240.0
EPS32 = float(torch.tensor(contract.EPS, dtype=torch.float32))  # 1e-12 as the fp32 the kernels use


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [..., K] (K even) -> bytes [..., K/2], low nibble = even index."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., K/2] -> uint8 codes [..., K] (inverse of :func:`pack_nibbles`)."""
    p = packed.to(torch.uint8)
    return torch.stack((p & 15, p >> 4), dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])


def grid(M: int, K: int, block_rows: int, block: int) -> tuple[int, int, int, int]:
    """Effective (br, bc, Mb, Kb): block_rows 0 = all rows, block 0 = the whole row."""
    br = max(M, 1) if block_rows == 0 else block_rows
    bc = K if block == 0 else block
    Mb = 1 if block_rows == 0 else -(-M // br)
    return br, bc, Mb, -(-K // bc)


def _blocked(x2: torch.Tensor, br, bc, Mb, Kb) -> torch.Tensor:
    """fp32 [Mb, Kb, br*bc] blocks of x2 (zero padded, NaN -> 0), row-major inside a block."""
    M, K = x2.shape
    pad = x2.new_zeros(Mb * br, Kb * bc)
    pad[:M, :K] = contract.nan_to_zero(x2)
    return pad.reshape(Mb, br, Kb, bc).permute(0, 2, 1, 3).reshape(Mb, Kb, br * bc)


def _expand(s: torch.Tensor, br, bc, M, K) -> torch.Tensor:
    return s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:M, :K]


def block_scales(x2: torch.Tensor, qtype: str, br, bc, Mb, Kb):
    """fp32 scale [Mb, Kb] and uint8 zero [Mb, Kb] (int4_zp) or None, by the rules above."""
    xb = _blocked(x2.float(), br, bc, Mb, Kb)
    if xb.shape[-1] == 0:           # no rows at all: every statistic is 0
        xb = xb.new_zeros(Mb, Kb, 1)
    if qtype == "int4_zp":
        _, s, z = contract.quantize_asym_int4(xb, -1)
        return s[..., 0], z[..., 0]
    if qtype == "q4_0":
        a = xb.abs()
        m = torch.gather(xb, -1, a.argmax(-1, keepdim=True))[..., 0]   # argmax: first occurrence
        ma = torch.clamp_min(a.amax(-1), contract.EPS)
        return torch.where(m < 0, -ma, ma) / -8.0, None
    if qtype == "fp8_e4m3fnuz":
        return torch.clamp_min(contract.absmax(xb, -1), contract.EPS) / FNUZ_QMAX, None
    return contract.scale_for(contract.absmax(xb, -1), QTYPES[qtype][1]), None


def quantize2d(x2: torch.Tensor, qtype: str, block_rows: int, block: int):
    """(codes [M, K] or packed [M, K/2], fp32 scale [Mb, Kb], uint8 zero [Mb, Kb] or None)."""
    M, K = x2.shape
    br, bc, Mb, Kb = grid(M, K, block_rows, block)
    xf = x2.float()
    scale, zero = block_scales(xf, qtype, br, bc, Mb, Kb)
    s = _expand(scale, br, bc, M, K)
    if qtype == "int4_zp":
        z = _expand(zero, br, bc, M, K).float()
        q = torch.round(contract.nan_to_zero(xf / s)) + z
        codes = q.clamp(0, 15).to(torch.uint8)
    elif qtype == "fp8_e4m3fnuz":
        codes = contract.nan_to_zero(xf / s).clamp(-FNUZ_QMAX, FNUZ_QMAX).to(torch.float8_e4m3fnuz)
    else:
        codes = contract.quantize_values(xf, s, QTYPES[qtype][1])
    if QTYPES[qtype][2]:
        codes = pack_nibbles(codes)
    return codes, scale, zero


# ---------------------------------------------------------------- reference backend kernel

def forward(x2, qtype, block_rows, block):
    return quantize2d(x2, qtype, block_rows, block)


def backward(*args):
    raise NotImplementedError("quantize_blocks has no gradient (rounding is piecewise constant)")
