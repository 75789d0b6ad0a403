"""A transformers ``Cache`` on tessera's paged KV cache: ``model.generate`` decodes through
``tessera.append_kv`` and ``tessera.decode_attention``.

    cache = tessera.paged_cache(model, max_tokens=512)          # model patched with attention=True
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=64)

Layout: one ``tessera.alloc_kv_cache`` per layer (fp32/fp16/bf16, or int8/fp8 pages with
per-(token, head) scales), vLLM's NHD pages; sequence b owns pages [b * P, (b + 1) * P) of the
block table (P = ceil(max_tokens / page_size)), so a ragged batch wastes no page between
sequences, only the tail of each.  ``seq_lens[b]`` counts sequence b's real tokens: padding
never enters the cache, so a left-padded batch decodes with each row's keys at positions
0..n_b - 1 (transformers gives the tokens those RoPE positions too, from the mask).

How a step runs: the attention module calls ``cache.update(k, v, layer)``; the layer only
records the new k/v (and returns them) and the ``tessera`` attention function -- which sees
the padding mask -- appends them to the pages (prefill: each row's valid tokens; decode: one
token per row at ``seq_lens``) and then attends: prefill over the new tokens themselves (the
cache was empty: exact, and the prompt's attention runs in the fp32 of its q/k/v as
vLLM's prefill does), decode with ``decode_attention`` over the pages (GQA, sliding window,
softcap passed through).  A cache used by any other attention function is detected on the
next layer's update (the recorded k/v were never consumed) and raises, rather than letting
sdpa attend over the new token alone.  Not supported (a clear error): a prefill after
tokens are cached (chunked prefill, assisted decoding), beam search's reorder, cropping.
"""
from __future__ import annotations

import math
import threading

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from . import attention as _attn

_STATE = threading.local()  # .pending: (layer, new_k, new_v) between a layer's update and its attention call


def _pending():
    return getattr(_STATE, "pending", None)


def _tessera():
    import tessera
    return tessera


class PagedLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, max_tokens: int, page_size: int, dtype):
        super().__init__()
        self.max_tokens, self.page_size, self.cache_dtype = max_tokens, page_size, dtype
        self.processed = 0          # tokens seen, padding included (transformers' mask / position length)

    def lazy_initialization(self, key_states, value_states) -> None:
        batch, heads, _, dim = key_states.shape
        pages = math.ceil(self.max_tokens / self.page_size)
        dtype = self.cache_dtype or key_states.dtype
        self.k_cache, self.v_cache, self.k_scale, self.v_scale = _tessera().alloc_kv_cache(
            batch * pages, self.page_size, heads, dim, dtype, device=key_states.device)
        self.block_table = torch.arange(batch * pages, dtype=torch.int32, device=key_states.device).view(batch, pages)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=key_states.device)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if _pending() is not None:
            _STATE.pending = None
            raise ValueError("tessera.paged_cache: the previous layer's keys were never appended -- the cache "
                             "needs the 'tessera' attention function (tessera.patch(model) with attention=True)")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self.processed and new != 1:
            raise ValueError(f"tessera.paged_cache: {new} new tokens after {self.processed} cached ones; only one "
                             "prefill followed by one-token decode steps is supported (no chunked prefill or "
                             "assisted decoding)")
        if self.processed + new > self.max_tokens:
            raise ValueError(f"tessera.paged_cache: {self.processed + new} tokens exceed max_tokens="
                             f"{self.max_tokens}")
        self.processed += new
        _STATE.pending = (self, key_states, value_states)
        return key_states, value_states

    def append(self, k, v, mask) -> None:
        """k, v (B, Hk, S, D); mask None or the (B, >= S) padding mask of this step's keys."""
        t = _tessera()
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()   # (B, S, Hk, D)
        scales = (self.k_scale, self.v_scale) if self.k_scale is not None else ()
        if k.shape[1] == 1 or mask is None:
            t.append_kv(k, v, self.k_cache, self.v_cache, self.block_table, self.seq_lens, *scales)
            self.seq_lens += k.shape[1]
            return
        valid = mask[:, -k.shape[1]:].to(torch.bool)
        counts = _attn._runs(valid, "prompt")
        for b in range(k.shape[0]):
            rows = valid[b]
            t.append_kv(k[b:b + 1, rows], v[b:b + 1, rows], self.k_cache, self.v_cache, self.block_table[b:b + 1],
                        self.seq_lens[b:b + 1], *scales)
        self.seq_lens += counts.to(torch.int32)

    def decode(self, query, scaling, sliding_window, softcap):
        """query (B, H, 1, D) -> (B, 1, H, D) over the pages."""
        out = _tessera().decode_attention(query[:, :, 0].contiguous(), self.k_cache, self.v_cache, self.block_table,
                                          self.seq_lens, scale=scaling, softcap=float(softcap or 0.0),
                                          window=int(sliding_window) if sliding_window else -1,
                                          k_scale=self.k_scale, v_scale=self.v_scale)
        return out.unsqueeze(1)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.processed + query_length, 0

    def get_seq_length(self) -> int:
        return self.processed

    def get_max_length(self) -> int:
        return self.max_tokens

    def reset(self) -> None:
        self.processed = 0
        if self.is_initialized:
            self.seq_lens.zero_()

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("tessera.paged_cache: beam search / cache cropping / batch reindexing are not "
                                  "supported; use greedy or sampling with one sequence per row")

    reorder_cache = crop = batch_repeat_interleave = batch_select_indices = _unsupported


class PagedKVCache(Cache):
    """One :class:`PagedLayer` per decoder layer of ``model``."""

    def __init__(self, model, max_tokens: int, page_size: int = 16, dtype=None):
        if getattr(model.config, "_attn_implementation", None) != _attn.NAME:
            raise ValueError(f"tessera.paged_cache: {type(model).__name__} does not use the tessera attention "
                             "function; call tessera.patch(model) (with attention=True) first")
        if not isinstance(max_tokens, int) or max_tokens < 1 or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"tessera.paged_cache: max_tokens ({max_tokens!r}) and page_size ({page_size!r}) must be "
                             "positive ints")
        layers = [PagedLayer(max_tokens, page_size, dtype) for _ in range(model.config.num_hidden_layers)]
        super().__init__(layers=layers)


def take_pending(key):
    """The paged layer whose update produced ``key`` in this attention call, or None."""
    pending = _pending()
    _STATE.pending = None
    if pending is not None and pending[1] is key:
        return pending[0], pending[2]
    return None
