"""Scaled dot-product attention (``tessera.attention``): MHA/GQA/MQA, causal, sliding window,
softcap, variable-length packed batches, forward and backward.

    s_ij = scale <q_i, k_j>  (softcap: s = softcap * tanh(s / softcap)),  masked by the window
    out_i = softmax_j(s_ij) v_j,   lse_i = logsumexp_j s_ij

Layout (batch, seq, heads, head_dim); with ``cu_seqlens_q``/``cu_seqlens_k`` (int32, (B+1,))
q/k/v are packed (total_tokens, heads, head_dim) as in FlashAttention's varlen API (zero-length
sequences allowed).  ``causal`` is bottom-right aligned when Lq != Lk (FlashAttention >= 2.1), i.e.
``window=(left, 0)``; ``window=(-1, -1)`` is unbounded.  A query row with no allowed key gives
out = 0 (never NaN) and lse = -inf.  ``lse`` is returned in fp32, (B, H, Sq) or (H, Tq) for varlen,
and is *not differentiable* (as in FlashAttention): it is marked non-differentiable, so using it in
a loss contributes no gradient.

The public layer packs every call into the varlen form ((B*S, H, D) + cu_seqlens [0, S, 2S, ...])
before a kernel module sees it: see ``attn_interface`` in the kernel modules (``ref.py``, ``cpu.py``,
``triton.py``, ``opencl.py``).  A module's ``forward`` also takes ``exact_lse``: False when the caller
did not ask for lse, so only the backward will read it; a module may then return an lse held to
the backward's needs rather than the fp32 rule (the cpu backend's SDPA route: within ~1e-4).
Accumulation is fp32 for every input dtype; the CPU kernel is a tiled online-softmax
(FlashAttention-2) forward and a recompute-from-lse backward (attention_fwd.c, attention_bwd.c,
attn_tiles.c; see cpu.py).  The opencl backend has the forward only (a work-group per
(block of query rows, head) with K/V tiles in local memory: attention.cl; a gradient request
raises BackendError there).

Roofline: compute-bound; FLOPs count only allowed (i, j) score entries: 4*D per entry forward
(QK^T and PV), 2.5x that backward (FlashAttention's convention).  Bytes: q, k, v read and out (+lse)
written forward; q, k, v, out, dout, lse read and dq, dk, dv written backward.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import contiguous, direct, shaped
from ..._registry import OpSpec, register_op, select
from .ref import attention_eager, attention_ref, window_bounds

OP = "attention"
MAX_HEAD_DIM = 256


def _check(q, k, v, cu_q, cu_k, scale, softcap, values=False):
    """Shapes/dtypes/devices (fake and real); cu_seqlens contents only with values=True (real)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(OP, name, t)
    _checks.same_device(OP, "q", q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    _checks.same_dtype(OP, "q", q, "k", k)
    _checks.same_dtype(OP, "q", q, "v", v)
    varlen = cu_q is not None or cu_k is not None
    if varlen and (cu_q is None or cu_k is None):
        missing = "cu_seqlens_k" if cu_k is None else "cu_seqlens_q"
        raise ValueError(f"tessera.{OP}: argument '{missing}' is None but the other cu_seqlens is given; "
                         "expected both (varlen) or neither (batched)")
    rank, what = (3, "(total_tokens, heads, head_dim) with cu_seqlens") if varlen else \
        (4, "(batch, seq, heads, head_dim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"tessera.{OP}: argument '{name}' ({_checks.describe(t)}) must be {rank}-D {what}")
    D = q.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"tessera.{OP}: argument 'q' ({_checks.describe(q)}) has head_dim {D}; "
                         f"expected 1..{MAX_HEAD_DIM}")
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != D:
            raise ValueError(f"tessera.{OP}: argument '{name}' ({_checks.describe(t)}) has head_dim "
                             f"{t.shape[-1]}; expected {D} (the head_dim of 'q' {tuple(q.shape)})")
    if not varlen and k.shape[0] != q.shape[0]:
        raise ValueError(f"tessera.{OP}: argument 'k' ({_checks.describe(k)}) has batch {k.shape[0]}; "
                         f"expected {q.shape[0]} (the batch of 'q' {tuple(q.shape)})")
    if v.shape != k.shape:
        raise ValueError(f"tessera.{OP}: argument 'v' ({_checks.describe(v)}) must have the shape of 'k' "
                         f"{tuple(k.shape)}")
    Hq, Hk = q.shape[-2], k.shape[-2]
    if Hk == 0 or Hq % Hk != 0:
        raise ValueError(f"tessera.{OP}: argument 'k' ({_checks.describe(k)}) has {Hk} heads, which must "
                         f"divide the {Hq} heads of 'q' {tuple(q.shape)} (MHA/GQA/MQA)")
    if varlen:
        for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
            if cu.dtype != torch.int32:
                raise TypeError(f"tessera.{OP}: argument '{name}' ({_checks.describe(cu)}) must be int32")
            if cu.dim() != 1 or cu.shape[0] < 1:
                raise ValueError(f"tessera.{OP}: argument '{name}' ({_checks.describe(cu)}) must be 1-D (batch+1,)")
        if cu_k.shape != cu_q.shape:
            raise ValueError(f"tessera.{OP}: argument 'cu_seqlens_k' ({_checks.describe(cu_k)}) must have the "
                             f"shape of 'cu_seqlens_q' {tuple(cu_q.shape)} (one entry per sequence + 1)")
        if values:
            for name, cu, t in (("cu_seqlens_q", cu_q, q), ("cu_seqlens_k", cu_k, k)):
                c = cu.tolist()
                if c[0] != 0 or any(b < a for a, b in zip(c, c[1:])) or c[-1] != t.shape[0]:
                    raise ValueError(f"tessera.{OP}: argument '{name}' ({_checks.describe(cu)}) = {c[:8]}"
                                     f"{'...' if len(c) > 8 else ''} must start at 0, be non-decreasing and end "
                                     f"at {t.shape[0]} (the tokens of {'q' if t is q else 'k'})")
    if scale is not None:
        _checks.finite_float(OP, "scale", scale)
    _checks.finite_float(OP, "softcap", softcap, min_value=0.0)


def _packed(t: Tensor, varlen: bool) -> Tensor:
    """(B, S, H, D) -> (B*S, H, D) without copying when the batch and token dims collapse."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = contiguous(t)  # a glue copy: fenced like the inputs under test (_library.contiguous)
    if varlen:
        return t
    try:
        return t.view(-1, t.shape[2], t.shape[3])
    except RuntimeError:
        return contiguous(t).view(-1, t.shape[2], t.shape[3])


def _prepare(q, k, v, cu_q, cu_k, max_q, max_k):
    """-> packed q, k, v, cu_q, cu_k (int32, contiguous), max_q, max_k (python ints)."""
    if cu_q is None:
        B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
        ar = torch.arange(B + 1, dtype=torch.int32, device=q.device)
        return _packed(q, False), _packed(k, False), _packed(v, False), ar * Sq, ar * Sk, Sq, Sk
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    lens = [(b - a) for a, b in zip(cu_q.tolist(), cu_q.tolist()[1:])], \
        [(b - a) for a, b in zip(cu_k.tolist(), cu_k.tolist()[1:])]
    mq, mk = max(lens[0], default=0), max(lens[1], default=0)
    for name, given, actual in (("max_seqlen_q", max_q, mq), ("max_seqlen_k", max_k, mk)):
        if given is not None and given < actual:
            raise ValueError(f"tessera.{OP}: argument '{name}'={given} is smaller than the longest sequence "
                             f"({actual}) in cu_seqlens")
    return q, k, v, cu_q, cu_k, mq, mk


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _attention_impl(q: Tensor, k: Tensor, v: Tensor, cu_q: Optional[Tensor], cu_k: Optional[Tensor],
               max_q: Optional[int], max_k: Optional[int], scale: Optional[float], window_left: int,
               window_right: int, softcap: float, backend: str, exact_lse: bool = True) -> tuple[Tensor, Tensor]:
    _check(q, k, v, cu_q, cu_k, scale, softcap, values=True)
    mod = select(SPEC, q.device, q.dtype, backend)
    qp, kp, vp, cq, ck, mq, mk = _prepare(q, k, v, cu_q, cu_k, max_q, max_k)
    out, lse = mod.forward(qp, kp, vp, cq, ck, mq, mk, _scale(q, scale), window_left, window_right, softcap,
                           exact_lse)
    if cu_q is None:  # (H, B*S) -> (B, H, S)
        lse = lse.view(q.shape[2], q.shape[0], q.shape[1]).transpose(0, 1).contiguous()
    return shaped(out, q.shape), lse


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


_attention = torch.library.custom_op("tessera::attention", mutates_args=())(_attention_impl)


@_attention.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, backend, exact_lse=True):
    _check(q, k, v, cu_q, cu_k, scale, softcap)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, cu_q is not None), dtype=torch.float32)


@torch.library.custom_op("tessera::attention_backward", mutates_args=())
def _attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        cu_q: Optional[Tensor], cu_k: Optional[Tensor], max_q: Optional[int],
                        max_k: Optional[int], scale: Optional[float], window_left: int, window_right: int,
                        softcap: float, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    mod = select(SPEC, q.device, q.dtype, backend)
    varlen = cu_q is not None
    qp, kp, vp, cq, ck, mq, mk = _prepare(q, k, v, cu_q, cu_k, max_q, max_k)
    lse_p = lse if varlen else lse.transpose(0, 1).reshape(q.shape[2], -1)
    dq, dk, dv = mod.backward(_packed(dout, varlen), qp, kp, vp, _packed(out, varlen), contiguous(lse_p), cq, ck,
                              mq, mk, _scale(q, scale), window_left, window_right, softcap)
    return shaped(dq, q.shape), shaped(dk, k.shape), shaped(dv, v.shape)


@_attention_backward.register_fake
def _(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window_left, window_right, softcap, backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, softcap, backend, _exact_lse = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.args = (max_q, max_k, scale, wl, wr, softcap, backend)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


_attention.register_autograd(_backward, setup_context=_setup)


def _python_types(q, k, v, causal, scale, window, softcap, cu_q, cu_k, max_q, max_k, return_lse):
    _checks.python_types(OP, {"q": q, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
                         {"softcap": softcap} if scale is None else {"softcap": softcap, "scale": scale})
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    for name, b in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(b, bool):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a bool, got {type(b).__name__}")
    if not (isinstance(window, (tuple, list)) and len(window) == 2
            and all(isinstance(w, (int, torch.SymInt)) and not isinstance(w, bool) for w in window)):
        raise TypeError(f"tessera.{OP}: argument 'window' must be a (left, right) pair of ints, got {window!r}")
    if window[0] < -1 or window[1] < -1:
        raise ValueError(f"tessera.{OP}: argument 'window'={tuple(window)} must hold ints >= -1 (-1 = unbounded)")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, torch.SymInt))):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be an int or None, got {type(m).__name__}")


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
              window: tuple[int, int] = (-1, -1), softcap: float = 0.0, cu_seqlens_q: Optional[Tensor] = None,
              cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
              max_seqlen_k: Optional[int] = None, return_lse: bool = False, *, backend: Optional[str] = None):
    """Attention over (batch, seq, heads, head_dim) tensors (or packed varlen with cu_seqlens).

    Returns ``out`` (q's shape and dtype), or ``(out, lse)`` with ``return_lse`` (lse fp32,
    (B, H, Sq) or (H, Tq) for varlen; not differentiable).  ``scale`` defaults to 1/sqrt(head_dim).
    """
    _python_types(q, k, v, causal, scale, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, return_lse)
    wl, wr = window_bounds(causal, window)
    run = direct(_attention, _attention_impl,
                 q, k, v, cu_seqlens_q, cu_seqlens_k)
    # exact_lse: the caller sees lse only with return_lse; otherwise only the backward reads it,
    # and a backend may return one accurate enough for that alone (the cpu backend's SDPA route)
    out, lse = run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   None if scale is None else float(scale), wl, wr, float(softcap),
                   _checks.backend_arg(OP, backend), return_lse)
    return (out, lse) if return_lse else out


from .spec import build_spec  # noqa: E402  (cases + roofline live in spec.py)

SPEC = register_op(build_spec(attention, attention_ref, attention_eager))
