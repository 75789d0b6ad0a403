"""Rotary position embedding of q and k in one pass (``tessera.rope``).

    q_out, k_out = rope(q, k, cos, sin, position_ids=None, interleaved=False, rotary_dim=None)

q (batch, seq, heads_q, head_dim) and k (batch, seq, heads_k, head_dim) -- the attention
layout, heads may differ (GQA/MQA) -- or packed varlen (tokens, heads, head_dim) with
``position_ids`` (tokens,) required.  cos/sin: (max_positions, rotary_dim // 2) tables in
fp32 or the input dtype (:func:`tessera.rope_cache` makes them).  position_ids: int32/int64
(batch, seq), (1, seq) or (seq,) broadcast over the batch, or None = arange(seq).  The first
``rotary_dim`` (default head_dim; even) features rotate, the rest pass through bit-exactly.
The formulas (half-split / interleaved) are in ``ref.py``.

Numerics: math in fp32 for every storage dtype, one rounding to the output dtype.  The
rotation a*c - b*s cancels when its terms are large and nearly equal, so for fp32 outputs
the kernels evaluate it without the plain formula's eps * |x| error: the CPU kernel adds back
the rounding error of the b*s product (an error-free transformation with FMA, float64 lanes
where there is no FMA), the Triton kernel multiplies in float64.  fp32 outputs are then
within ~1 ulp of the exact result relative to |out|, which the fp32 tolerance (rtol 1.3e-6,
atol 1e-5) demands of inputs of magnitude 1e4 (the ``large-magnitude`` cases).  fp16/bf16
outputs use the plain fp32 formula (its error is far below their own rounding).

Position ids are checked on the host (one min/max over batch*seq ints, negligible next to
the heads*head_dim elements per token the op moves; on a GPU it costs one sync): an id
outside [0, max_positions) is a ValueError.  The kernels are also safe on their own: the
CPU kernel returns an error for such an id, the OpenCL kernel flags it (the launcher raises), the
Triton kernel masks the table read.

Backward (one fused kernel per backend, ``tessera::rope_backward``): the gradient of a
rotation is the rotation by the opposite angle, so dq/dk are the same kernel with sin
negated; pass-through features copy the gradient.  cos/sin are buffers: they get no
gradient (a ``requires_grad`` table receives None).

Outputs are new contiguous tensors in the input dtype; q and k may be any views whose
last dim has unit stride (slices of a fused qkv projection, (B, H, S, D) transposes) --
other layouts are copied first.  Roofline: read q, k (+ the cos/sin rows and ids used),
write q_out, k_out.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct, shaped
from ..._registry import OpSpec, register_op, select
from .cache import rope_cache
from .ref import rope_eager, rope_ref

OP = "rope"
_INT = (torch.int32, torch.int64)


def _check(q, k, cos, sin, position_ids, interleaved, rotary_dim):
    """Shapes, dtypes, devices (no values: this also runs on fake tensors).  Returns r."""
    d = _checks.describe
    _checks.tensor(OP, "q", q)
    if q.dim() not in (3, 4):
        raise ValueError(f"tessera.{OP}: argument 'q' ({d(q)}) must be (batch, seq, heads, head_dim) "
                         "or packed (tokens, heads, head_dim)")
    _checks.tensor(OP, "k", k)
    if k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"tessera.{OP}: argument 'k' ({d(k)}) must match 'q' {tuple(q.shape)} in every "
                         "dim but the heads (dim -2)")
    _checks.same_dtype(OP, "q", q, "k", k)
    D = q.shape[-1]
    r = D if rotary_dim < 0 else rotary_dim
    if r < 2 or r % 2 or r > D:
        what = f"rotary_dim={rotary_dim}" if rotary_dim >= 0 else f"rotary_dim=None (head_dim={D})"
        raise ValueError(f"tessera.{OP}: argument {what} must be an even number in [2, head_dim={D}]"
                         + ("; pass an even rotary_dim for an odd head_dim" if rotary_dim < 0 else ""))
    for name, t in (("cos", cos), ("sin", sin)):
        _checks.tensor(OP, name, t)
        if t.dtype not in (torch.float32, q.dtype):
            raise TypeError(f"tessera.{OP}: argument '{name}' ({d(t)}) must be float32 or q's dtype ({q.dtype})")
        if t.dim() != 2 or t.shape[1] != r // 2:
            raise ValueError(f"tessera.{OP}: argument '{name}' ({d(t)}) must be (max_positions, rotary_dim // 2 "
                             f"= {r // 2}); a table of width rotary_dim holding each frequency twice (HF "
                             f"layout) can be passed as {name}[:, :{r // 2}]")
    if sin.shape != cos.shape or sin.dtype != cos.dtype:
        raise ValueError(f"tessera.{OP}: argument 'sin' ({d(sin)}) must have the shape and dtype of 'cos' ({d(cos)})")
    tokens = q.shape[:-2]
    if position_ids is not None:
        _checks.tensor(OP, "position_ids", position_ids, dtypes=_INT)
        ok = position_ids.shape == tokens or (q.dim() == 4 and (
            position_ids.shape == tokens[1:] or position_ids.shape == (1, tokens[1])))
        if not ok:
            want = f"{tuple(tokens)}, (1, {tokens[1]}) or ({tokens[1]},)" if q.dim() == 4 else f"{tuple(tokens)}"
            raise ValueError(f"tessera.{OP}: argument 'position_ids' ({d(position_ids)}) must have shape {want} "
                             f"for q {tuple(q.shape)}")
    elif q.dim() == 3:
        raise ValueError(f"tessera.{OP}: argument 'position_ids' is required for packed 3-D q ({d(q)}): "
                         "each token's position within its sequence")
    _checks.same_device(OP, "q", q, k=k, cos=cos, sin=sin, position_ids=position_ids)
    return r


def _check_positions(q, cos, position_ids):
    """Values (real tensors only): every id in [0, max_positions)."""
    P = cos.shape[0]
    if position_ids is None:
        if q.shape[1] > P:
            raise ValueError(f"tessera.{OP}: seq={q.shape[1]} positions (position_ids=None means arange(seq)) "
                             f"exceed the cos/sin table's max_positions={P}")
        return
    if position_ids.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(position_ids))
    if lo < 0 or hi >= P:
        bad = lo if lo < 0 else hi
        raise ValueError(f"tessera.{OP}: argument 'position_ids' holds {bad}, outside [0, max_positions={P}) "
                         f"of the cos/sin tables ({_checks.describe(cos)})")


def _views(q, k, cos, sin, position_ids):
    """The kernel-module layout: 4-D q/k with unit last stride, (B, S) ids (broadcast by expand)."""
    def as4(t):
        t = t.unsqueeze(0) if t.dim() == 3 else t
        return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else contiguous(t)

    def unit(t):
        return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else contiguous(t)

    q4, k4 = as4(q), as4(k)
    pos = position_ids
    if pos is not None:
        pos = pos.reshape(1, -1) if pos.dim() == 1 else pos
        pos = pos.expand(q4.shape[0], q4.shape[1])
    return q4, k4, unit(cos), unit(sin), pos


def _rope_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor], interleaved: bool,
          rotary_dim: int, backend: str) -> tuple[Tensor, Tensor]:
    r = _check(q, k, cos, sin, position_ids, interleaved, rotary_dim)
    mod = select(SPEC, q.device, q.dtype, backend)
    # ids' values: a kernel that checks them itself (CHECKS_POSITIONS) spares the torch op here
    if position_ids is None or not getattr(mod, "CHECKS_POSITIONS", False):
        _check_positions(q, cos, position_ids)
    qo, ko = mod.forward(*_views(q, k, cos, sin, position_ids), interleaved, r)
    return shaped(qo, q.shape), shaped(ko, k.shape)


_rope = torch.library.custom_op("tessera::rope", mutates_args=())(_rope_impl)


@_rope.register_fake
def _(q, k, cos, sin, position_ids, interleaved, rotary_dim, backend):
    _check(q, k, cos, sin, position_ids, interleaved, rotary_dim)
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.custom_op("tessera::rope_backward", mutates_args=())
def _rope_backward(dq_out: Tensor, dk_out: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor],
                   interleaved: bool, rotary_dim: int, backend: str) -> tuple[Tensor, Tensor]:
    mod = select(SPEC, dq_out.device, dq_out.dtype, backend)
    r = dq_out.shape[-1] if rotary_dim < 0 else rotary_dim
    dq, dk = mod.backward(*_views(dq_out, dk_out, cos, sin, position_ids), interleaved, r)
    return shaped(dq, dq_out.shape), shaped(dk, dk_out.shape)


@_rope_backward.register_fake
def _(dq_out, dk_out, cos, sin, position_ids, interleaved, rotary_dim, backend):
    return dq_out.new_empty(dq_out.shape), dk_out.new_empty(dk_out.shape)


def _setup(ctx, inputs, output):
    q, k, cos, sin, position_ids, interleaved, rotary_dim, backend = inputs
    ctx.shapes = (q.shape, k.shape)
    ctx.dtype = q.dtype
    ctx.args = (interleaved, rotary_dim, backend)
    ctx.save_for_backward(cos, sin, position_ids)


def _backward(ctx, dq_out, dk_out):
    cos, sin, position_ids = ctx.saved_tensors
    (qs, ks), dt = ctx.shapes, ctx.dtype
    dq_out = dq_out if dq_out is not None else torch.zeros(qs, dtype=dt, device=cos.device)
    dk_out = dk_out if dk_out is not None else torch.zeros(ks, dtype=dt, device=cos.device)
    dq, dk = _rope_backward(dq_out, dk_out, cos, sin, position_ids, *ctx.args)
    return dq, dk, None, None, None, None, None, None


_rope.register_autograd(_backward, setup_context=_setup)


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Optional[Tensor] = None,
         interleaved: bool = False, rotary_dim: Optional[int] = None, *,
         backend: Optional[str] = None) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q and k (see the module docstring); returns ``(q_out, k_out)``."""
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if position_ids is not None and not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"tessera.{OP}: argument 'position_ids' must be a torch.Tensor or None, "
                        f"got {type(position_ids).__name__}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"tessera.{OP}: argument 'interleaved' must be a bool, got {type(interleaved).__name__}")
    if rotary_dim is not None and (isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, torch.SymInt))):
        raise TypeError(f"tessera.{OP}: argument 'rotary_dim' must be an int or None, got {type(rotary_dim).__name__}")
    run = direct(_rope, _rope_impl, q, k, cos, sin, position_ids)
    return run(q, k, cos, sin, position_ids, interleaved, -1 if rotary_dim is None else rotary_dim,
               _checks.backend_arg(OP, backend))


# ---------------------------------------------------------------- spec (cases in cases.py)

def _bytes(kw):
    q, k, cos = kw["q"], kw["k"], kw["cos"]
    pos = kw.get("position_ids")
    rows = q.shape[1] if pos is None else min(int(torch.unique(pos).numel()), cos.shape[0])
    n = 2 * (q.numel() + k.numel()) * q.element_size()          # read q, k; write q_out, k_out
    n += 2 * rows * cos.shape[1] * cos.element_size()          # the cos/sin rows used
    return n + (0 if pos is None else pos.numel() * pos.element_size())


def _flops(kw):
    q, k = kw["q"], kw["k"]
    r = kw.get("rotary_dim") or q.shape[-1]
    return 3 * (q.numel() + k.numel()) // q.shape[-1] * r    # x*c + y*s per rotated element


from . import cases as _cases  # noqa: E402  (cases import rope_cache only)

SPEC = register_op(OpSpec(
    name=OP, fn=rope, ref=rope_ref, eager=rope_eager,
    kernels={"reference": "tessera.ops.rope.ref", "cpu": "tessera.ops.rope.cpu",
             "triton": "tessera.ops.rope.triton", "opencl": "tessera.ops.rope.opencl",
             "cpu:aarch64": "tessera.ops.rope.cross", "cpu:riscv64": "tessera.ops.rope.cross"},
    cases=_cases.cases(), grad_inputs=("q", "k"),
    bytes_fwd=_bytes, bytes_bwd=_bytes, flops_fwd=_flops, flops_bwd=_flops,
    bench_cases=_cases.bench_cases(),
    fuzz="test_rope.py",  # the generic row fuzz cannot build cos/sin tables and position ids
))

__all__ = ["rope", "rope_cache"]
