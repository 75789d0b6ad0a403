"""model.generate on tessera's paged KV cache (tessera.paged_cache): greedy tokens equal the
unpatched transformers model's for 64 new tokens (fp32), batch 1 and a left-padded ragged batch;
the decode steps really run tessera::append_kv / decode_attention; misuse raises.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tessera  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

NEW = 64
GREEDY = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)


def tiny(family="llama"):
    torch.manual_seed(0)
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **kw, head_dim=16, query_pre_attn_scalar=16, sliding_window=24, attn_logit_softcapping=0.5,
        final_logit_softcapping=3.0)).eval()


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tessera":
            name = func.name().split("::")[1].split(".")[0]
            self.n[name] = self.n.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["llama", pytest.param("gemma2", marks=pytest.mark.slow)])
def test_generate_on_paged_cache_matches_transformers(family):
    """Gemma 2 (``-m slow``: ~10 s more) adds a sliding window shorter than prompt + new tokens
    and both softcaps."""
    model = tiny(family)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 128, (3, 13), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0          # ragged: rows of 13, 9 and 4 prompt tokens, left-padded
    mask[2, :9] = 0
    ids[mask == 0] = 0
    ref = model.generate(ids, attention_mask=mask, **GREEDY)
    ref1 = model.generate(ids[:1], **GREEDY)
    with tessera.patched(model):
        cache = tessera.paged_cache(model, max_tokens=13 + NEW, page_size=8)
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, **GREEDY)
        # padding never enters the pages: each row holds its real prompt plus every token fed back
        assert cache.layers[0].seq_lens.tolist() == [13 + NEW - 1, 9 + NEW - 1, 4 + NEW - 1]
        with OpCount() as seen:
            out1 = model.generate(ids[:1], past_key_values=tessera.paged_cache(model, max_tokens=80), **GREEDY)
    assert torch.equal(out, ref), (out != ref).nonzero()[:5]
    assert torch.equal(out1, ref1)
    layers = model.config.num_hidden_layers
    # the prefill attends with tessera.attention, the NEW - 1 decode steps with decode_attention
    assert seen.n.get("decode_attention") == layers * (NEW - 1), seen.n
    assert seen.n.get("append_kv") == layers * NEW, seen.n


def test_paged_cache_misuse():
    model = tiny()
    with pytest.raises(ValueError, match="tessera.patch"):
        tessera.paged_cache(model, max_tokens=64)
    ids = torch.randint(3, 128, (1, 5))
    with tessera.patched(model):
        cache = tessera.paged_cache(model, max_tokens=8)
        with pytest.raises(ValueError, match="exceed max_tokens=8"):
            model.generate(ids, past_key_values=cache, **GREEDY)
    with tessera.patched(model):
        cache = tessera.paged_cache(model, max_tokens=64)
    # the cache used by a model whose attention is not tessera's: refused, not silently wrong
    with pytest.raises(ValueError, match="never appended"):
        model.generate(ids, past_key_values=cache, max_new_tokens=2, do_sample=False)
