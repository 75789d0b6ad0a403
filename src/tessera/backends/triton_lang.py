"""``@triton.jit`` helpers shared by the Triton kernel modules.

Imports triton, so only kernel modules import it (``backends/triton.py`` stays
importable without triton for ``tessera info`` and lean ``import tessera``).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_bf16(v, RNE_BF16: tl.constexpr):
    """fp32 values rounded to nearest even at bf16 precision, NaN kept: a following bf16 cast is
    then exact.  Needed under the interpreter, whose fp32 -> bf16 cast truncates."""
    if RNE_BF16:
        u = v.to(tl.uint32, bitcast=True)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        v = tl.where(v != v, v, u.to(tl.float32, bitcast=True))
    return v
