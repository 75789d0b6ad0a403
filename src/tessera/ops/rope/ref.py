"""RoPE float64 reference, the plain-PyTorch baseline, and the ``reference`` backend's kernels.

With r = rotary_dim, angle row (c, s) = (cos[pos], sin[pos]) of r/2 entries:

* half-split (GPT-NeoX / Llama, ``interleaved=False``): x1 = x[:r/2], x2 = x[r/2:r]
      out1 = x1 c - x2 s,   out2 = x2 c + x1 s
* interleaved (GPT-J): pairs (x[2i], x[2i+1]) rotate by angle i
      out[2i] = x[2i] c_i - x[2i+1] s_i,   out[2i+1] = x[2i+1] c_i + x[2i] s_i

Features r..head_dim pass through unchanged.  The gradient of a rotation is the
rotation by the opposite angle (s -> -s); cos/sin are buffers (no gradient).
"""
from __future__ import annotations

import torch

from ...backends.reference import up

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _positions(q, position_ids):
    """Long position ids broadcastable against q's token dims ((S,) for 4-D q without ids)."""
    if position_ids is None:
        return torch.arange(q.shape[1], device=q.device)
    return position_ids.to(torch.long)  # the test matrix hands the reference float64 ids


def _rotate(x, c, s, interleaved, r):
    """x (..., D); c, s (..., r/2) broadcast over x's head dim; math in x's dtype."""
    xr, xp = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rot, xp), dim=-1)


def rope_ref(q, k, cos, sin, position_ids=None, interleaved=False, rotary_dim=None):
    """Float64 reference of ``tessera.rope`` (returns float64 ``(q_out, k_out)``)."""
    r = q.shape[-1] if rotary_dim is None else rotary_dim
    pos = _positions(q, position_ids)
    c, s = up(cos)[pos].unsqueeze(-2), up(sin)[pos].unsqueeze(-2)   # (..., tokens, 1, r/2)
    return _rotate(up(q), c, s, interleaved, r), _rotate(up(k), c, s, interleaved, r)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def rope_eager(q, k, cos, sin, position_ids=None, interleaved=False, rotary_dim=None):
    """What a user writes in plain PyTorch (HF transformers' ``apply_rotary_pos_emb`` with
    ``rotate_half``, GPT-J's ``rotate_every_two`` when interleaved), in the input dtype."""
    r = q.shape[-1] if rotary_dim is None else rotary_dim
    pos = _positions(q, position_ids)
    c, s = cos[pos].to(q.dtype), sin[pos].to(q.dtype)
    if interleaved:
        c, s, rot = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1), _rotate_every_two
    else:
        c, s, rot = torch.cat((c, c), -1), torch.cat((s, s), -1), _rotate_half
    c, s = c.unsqueeze(-2), s.unsqueeze(-2)

    def apply(x):
        xr, xp = x[..., :r], x[..., r:]
        return torch.cat((xr * c + rot(xr) * s, xp), dim=-1)

    return apply(q), apply(k)


# ---------------------------------------------------------------- reference backend kernels
# Kernel-module interface (shared by cpu.py and triton.py):
#   q (B, S, Hq, D), k (B, S, Hk, D): last dim unit stride, other strides arbitrary;
#   cos, sin (P, r/2), unit last stride, fp32 or the input dtype;
#   pos: None (position = sequence index) or (B, S) int32/int64, any strides (0 = broadcast),
#        every value in [0, P) (checked by the caller);
#   returns contiguous (B, S, Hq, D), (B, S, Hk, D) in the input dtype.

def _apply(q, k, cos, sin, pos, interleaved, rotary_dim, sign):
    S = q.shape[1]
    idx = torch.arange(S, device=q.device).unsqueeze(0) if pos is None else pos.to(torch.long)
    c, s = up(cos)[idx].unsqueeze(-2), sign * up(sin)[idx].unsqueeze(-2)
    return tuple(_rotate(up(x), c, s, interleaved, rotary_dim).to(x.dtype).contiguous() for x in (q, k))


def forward(q, k, cos, sin, pos, interleaved, rotary_dim):
    return _apply(q, k, cos, sin, pos, interleaved, rotary_dim, 1.0)


def backward(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim):
    """dx = rotation of dx_out by the opposite angle (the transpose of a rotation)."""
    return _apply(dq_out, dk_out, cos, sin, pos, interleaved, rotary_dim, -1.0)
