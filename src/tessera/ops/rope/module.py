"""``tessera.nn.RotaryEmbedding``: the cos/sin tables as (non-persistent) buffers + ``tessera.rope``."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import rope
from .cache import rope_cache


class RotaryEmbedding(torch.nn.Module):
    """``forward(q, k, position_ids=None) -> (q_out, k_out)`` for (batch, seq, heads, head_dim)
    or packed (tokens, heads, head_dim) q/k (see :func:`tessera.rope`).

    The tables are computed once by :func:`tessera.rope_cache` (float64 math) and kept as
    non-persistent buffers: they move with ``.to(device)`` and stay out of ``state_dict``
    (they are a function of the arguments below).  They get no gradient.
    """

    def __init__(self, rotary_dim: int, max_positions: int = 4096, base: float = 10000.0, scaling=None,
                 interleaved: bool = False, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        cos, sin = rope_cache(max_positions, rotary_dim, base=base, scaling=scaling, dtype=dtype, device=device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.rotary_dim, self.max_positions, self.base = rotary_dim, max_positions, base
        self.scaling, self.interleaved = scaling, interleaved

    def forward(self, q: Tensor, k: Tensor, position_ids: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        return rope(q, k, self.cos, self.sin, position_ids, self.interleaved, self.rotary_dim)

    def extra_repr(self) -> str:
        return (f"rotary_dim={self.rotary_dim}, max_positions={self.max_positions}, base={self.base}, "
                f"scaling={self.scaling!r}, interleaved={self.interleaved}")
