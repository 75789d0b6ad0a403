"""Attention and RoPE of a ``transformers`` model on tessera ops.

Attention goes through transformers' own attention-function registry: ``"tessera"`` is
registered in ``AttentionInterface`` (and a mask builder under the same name in
``AttentionMaskInterface``), and ``tessera.patch`` sets ``config._attn_implementation`` to
it.  Every attention module of every family then calls :func:`tessera_attention` with
q (B, H, S, D), k/v (B, Hkv, Skv, D) -- after RoPE and the KV-cache update -- and the
per-layer options the model passes (``scaling``, ``sliding_window``, ``softcap``):

* GQA/MQA: ``tessera.attention`` takes Hkv < H directly (no ``repeat_kv`` copy);
* causal: the module's ``is_causal`` (decoders True, BERT False), bottom-right aligned,
  which is transformers' rule for a query block at the end of a longer cache;
* sliding window ``w``: transformers keeps key j for query i when i - w < j <= i, so
  ``window=(w - 1, 0)``;
* softcap: Gemma 2's ``attn_logit_softcapping``.

Masks: the registered mask builder is transformers' FlashAttention one -- ``None`` when no
token is padding, else the 2-D (B, Skv) boolean padding mask.  Padding goes through the
varlen form of ``tessera.attention``: each row's valid queries and keys are packed with
cu_seqlens (left or right padding, so each row's tokens are one contiguous run: anything
else is a ValueError), and padded query rows get zeros (their values are never read by a
valid token; sdpa/eager leave arbitrary values there).  Dropout on attention probabilities
has no kernel: a training-mode module with dropout > 0 raises (set the config's attention
dropout to 0).  Packed sequences (position ids restarting inside a row without a mask)
are refused the same way rather than attended across.

RoPE: transformers' ``apply_rotary_pos_emb(q, k, cos, sin)`` gets cos/sin per token,
(B or 1, S, R), the half-split table duplicated (``cat(freqs, freqs)``).  Their first
halves are the (positions, R/2) tables ``tessera.rope`` takes, indexed by a
position id per token (``arange``), R < head_dim (Phi-3's partial rotary) is
``rotary_dim``.  The module-level function is swapped by a dispatcher that takes this path
only inside a patched attention module (see ``_undo.py``).
"""
from __future__ import annotations

import sys

import torch

from .. import ops as _ops  # noqa: F401  (the tessera:: ops are registered by `import tessera`)
from . import _undo

NAME = "tessera"


def _tessera():
    import tessera
    return tessera


def register() -> None:
    """Register the attention function and its mask builder with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, \
        flash_attention_mask
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, tessera_attention)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(NAME, flash_attention_mask)


def _runs(mask: torch.Tensor, what: str) -> torch.Tensor:
    """Per-row counts of a (B, L) bool mask whose True entries form one contiguous run."""
    n = mask.sum(1)
    start = mask.to(torch.int8).argmax(1)
    ar = torch.arange(mask.shape[1], device=mask.device)
    expect = (ar >= start[:, None]) & (ar < (start + n)[:, None])
    if not torch.equal(expect, mask):
        raise ValueError(f"tessera.patch attention: the {what} padding mask {tuple(mask.shape)} has a row whose "
                         "valid tokens are not one contiguous run; expected left or right padding only")
    return n


def _cu(n: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(n.cumsum(0), (1, 0)).to(torch.int32)


def tessera_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function signature on ``tessera.attention``; returns (out (B, S, H, D), None)."""
    if dropout and module.training:
        raise ValueError(f"tessera.patch attention: {type(module).__name__} is in training mode with attention "
                         f"dropout {dropout}; tessera.attention has no dropout -- set the config's attention "
                         "dropout to 0 (or patch with attention=False)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"tessera.patch attention: got a {attention_mask.dim()}-D attention mask "
                         f"{tuple(attention_mask.shape)}; expected None or a 2-D padding mask (custom 4-D masks "
                         "are not supported: patch with attention=False)")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = (int(sliding_window) - 1, 0) if sliding_window else (-1, -1)
    if window[0] >= 0 and not causal:
        window = (window[0], window[0])
    kw = dict(causal=causal, scale=scaling, window=window, softcap=float(softcap or 0.0))
    paged = _paged(key)
    if paged is not None:                      # tessera.paged_cache: append, then decode over the pages
        layer, value = paged
        was_empty = int(layer.seq_lens.max()) == 0
        layer.append(key, value, attention_mask)
        if not was_empty:
            return layer.decode(query, scaling, sliding_window, softcap), None
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)   # (B, S, H, D) views
    if attention_mask is None:
        pos = kwargs.get("position_ids")
        if pos is not None and causal and q.shape[1] > 1 and q.shape[1] == k.shape[1] and \
                bool((pos[..., 1:] != pos[..., :-1] + 1).any()):
            raise ValueError("tessera.patch attention: position_ids restart inside a row (packed sequences "
                             "without a mask); tessera's patch does not support packed batches yet -- pass an "
                             "attention_mask with one sequence per row")
        return _tessera().attention(q, k, v, **kw), None
    mask = attention_mask.to(torch.bool)
    if mask.shape[1] > k.shape[1]:
        mask = mask[:, -k.shape[1]:]
    if mask.shape[1] != k.shape[1]:
        raise ValueError(f"tessera.patch attention: padding mask {tuple(attention_mask.shape)} is shorter than the "
                         f"{k.shape[1]} keys")
    qmask = mask[:, -q.shape[1]:]
    nq, nk = _runs(qmask, "query"), _runs(mask, "key")
    out = _tessera().attention(q[qmask], k[mask], v[mask], cu_seqlens_q=_cu(nq), cu_seqlens_k=_cu(nk),
                               max_seqlen_q=int(nq.max()), max_seqlen_k=int(nk.max()), **kw)
    full = q.new_zeros(q.shape)
    full[qmask] = out
    return full, None


def _paged(key):
    mod = sys.modules.get("tessera.patch.paged_cache")     # loaded only once a paged cache exists
    return None if mod is None else mod.take_pending(key)


def hf_rope(q, k, cos, sin, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb`` on ``tessera.rope`` (q/k (B, H, S, D), cos/sin (B or 1, S, R))."""
    if unsqueeze_dim != 1 or cos.dim() != 3:
        raise ValueError(f"tessera.patch rope: expected cos/sin (batch, seq, rotary_dim) and unsqueeze_dim=1, got "
                         f"cos {tuple(cos.shape)}, unsqueeze_dim={unsqueeze_dim}")
    rot = cos.shape[-1]
    half = rot // 2
    rows = cos.shape[0] * cos.shape[1]
    tab_c, tab_s = cos[..., :half].reshape(rows, half), sin[..., :half].reshape(rows, half)
    pos = torch.arange(rows, device=q.device).view(cos.shape[0], cos.shape[1])
    qo, ko = _tessera().rope(q.transpose(1, 2), k.transpose(1, 2), tab_c, tab_s, pos,
                             rotary_dim=None if rot == q.shape[-1] else rot)
    return qo.transpose(1, 2), ko.transpose(1, 2)


def rope_dispatcher(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if _undo.ROPE_ACTIVE.get():
            return hf_rope(q, k, cos, sin, *args, **kwargs)
        return original(q, k, cos, sin, *args, **kwargs)
    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _rope_forward(self, *args, **kwargs):
    """A patched attention module: its class forward, with apply_rotary_pos_emb on tessera.rope."""
    _undo.ensure_global(type(self).__module__, "apply_rotary_pos_emb", rope_dispatcher)
    token = _undo.ROPE_ACTIVE.set(True)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _undo.ROPE_ACTIVE.reset(token)


def patch_rope(model, attn_module) -> None:
    """Route ``attn_module``'s ``apply_rotary_pos_emb`` calls to tessera.rope."""
    modname = type(attn_module).__module__
    if not hasattr(sys.modules[modname], "apply_rotary_pos_emb"):
        raise ValueError(f"tessera.patch: rope=True but {modname} has no apply_rotary_pos_emb to swap "
                         f"(attention module {type(attn_module).__name__}); patch with rope=False")
    _undo.swap_global(model, modname, "apply_rotary_pos_emb", rope_dispatcher)
    _undo.override_forward(model, attn_module, _rope_forward)


def patch_attention(model) -> None:
    register()
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")
               and hasattr(m.config, "_attn_implementation")}
    for cfg in configs.values():
        _undo.set_attr(model, cfg, "_attn_implementation", NAME)
