"""One-call patching of Hugging Face ``transformers`` models onto tessera ops.

    model = tessera.patch(model)            # in place; returns the model
    tessera.unpatch(model)                  # back to the original code
    with tessera.patched(model): ...        # patched inside the block only

Keyword switches (all True by default): ``rms_norm``, ``layer_norm`` (BERT: fused with the
residual add), ``swiglu`` / ``geglu`` (the gated MLP, by the config's activation), ``rope``
(``apply_rotary_pos_emb``), ``attention`` (transformers' ``AttentionInterface`` registry:
GQA, causal, sliding window and softcap as the model's config and layers say), ``loss``
(``*ForCausalLM`` with ``labels``: fused linear cross-entropy, no logits).  What each swap
does and its numerics: ``decoder.py`` (norms, MLPs, loss), ``encoder.py`` (BERT), and
``attention.py`` (attention, masks, RoPE); how it is undone: ``_undo.py``.

Families, by ``config.model_type``: llama, mistral, qwen2, qwen3 (q/k norms), gemma2,
gemma3_text (``Gemma3ForCausalLM``; softcaps, sliding window, (1 + w) norms), phi3, bert.
Anything else is a ValueError naming the class and model_type found (a swap that silently
left the original code in place would be worse than none).  A requested swap that finds no
module to act on in a supported family is an error too (the modeling code changed shape).
``model._tessera_counts`` says how many modules each switch swapped.  Tested with the
``transformers`` version pinned in the ``[hf]`` extra; ``import tessera`` never imports it.

``tessera.paged_cache(model, max_tokens)`` (``paged_cache.py``) is a transformers Cache on
tessera's paged KV cache for ``model.generate`` on a patched model.

Not covered (errors, not silent fallbacks): attention dropout in training mode, custom 4-D
masks, packed sequences without a mask, activations without a gated kernel.  Not fused: the
decoder blocks' residual adds (they sit in the decoder layer's forward, outside the swapped
modules; BERT's post-norm blocks are fused).  ``tessera.patch`` is this function; the package
is importable as ``from tessera.patch import attention`` (``import tessera.patch.attention as x``
resolves through the function and fails).
"""
from __future__ import annotations

import contextlib

from . import _undo

DECODERS = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "phi3": False,
            "gemma2": True, "gemma3_text": True}    # model_type -> RMSNorm scales by (1 + w)
ENCODERS = {"bert"}
SWITCHES = ("rms_norm", "layer_norm", "swiglu", "geglu", "rope", "attention", "loss")


def _family(model) -> str:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in DECODERS or model_type in ENCODERS:
        return model_type
    supported = sorted(DECODERS) + sorted(ENCODERS)
    raise ValueError(f"tessera.patch: unsupported architecture {type(model).__name__} (config.model_type "
                     f"{model_type!r}); supported model types: {', '.join(supported)}")


def _attention_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")
            and any(hasattr(m, n) for n in ("q_proj", "qkv_proj"))]


def _patch_decoder(model, family: str, flags: dict, counts: dict) -> None:
    from . import attention, decoder
    offset = DECODERS[family]
    for module in list(model.modules()):
        name = type(module).__name__
        if flags["rms_norm"] and name.endswith("RMSNorm"):
            decoder.patch_rms_norm(model, module, offset)
            counts["rms_norm"] += 1
        elif name.endswith("MLP") and (flags["swiglu"] or flags["geglu"]):
            config = getattr(module, "config", None) or model.config
            if decoder.patch_mlp(model, module, config, flags["swiglu"], flags["geglu"]):
                counts["swiglu" if decoder._ACTS[decoder._activation(config, module)][0] == "swiglu"
                       else "geglu"] += 1
    if flags["rope"]:
        for module in _attention_modules(model):
            attention.patch_rope(model, module)
            counts["rope"] += 1
    if flags["loss"] and hasattr(model, "lm_head") and hasattr(model, "model"):
        decoder.patch_causal_lm_loss(model)
        counts["loss"] += 1


def _check_counts(model, family: str, flags: dict, counts: dict) -> None:
    expected = {"rms_norm", "rope", "attention"} if family in DECODERS else {"layer_norm", "attention"}
    for switch in expected:
        if flags[switch] and not counts[switch]:
            raise ValueError(f"tessera.patch: {switch}=True but no module of {type(model).__name__} "
                             f"({family}) matched; its modeling code differs from the one tessera knows")
    if family in DECODERS and (flags["swiglu"] or flags["geglu"]) and not (counts["swiglu"] or counts["geglu"]):
        config = model.config
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
        if (act in ("silu", "swish") and flags["swiglu"]) or (act and act.startswith("gelu") and flags["geglu"]):
            raise ValueError(f"tessera.patch: no gated MLP module of {type(model).__name__} ({family}) matched")


def patch(model, *, rms_norm: bool = True, layer_norm: bool = True, swiglu: bool = True, geglu: bool = True,
          rope: bool = True, attention: bool = True, loss: bool = True):
    """Swap ``model``'s norms, gated MLPs, RoPE, attention and causal-LM loss for tessera ops, in place.

    Returns the model.  Raises ValueError for an unsupported architecture, a model already
    patched, or a module whose structure the patch does not know; the model is left
    unpatched when it raises.
    """
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ImportError("tessera.patch needs transformers: pip install 'tessera[hf]'") from e
    flags = dict(rms_norm=rms_norm, layer_norm=layer_norm, swiglu=swiglu, geglu=geglu, rope=rope,
                 attention=attention, loss=loss)
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"tessera.patch: argument '{name}' must be a bool, got {type(value).__name__}")
    family = _family(model)
    if _undo.is_patched(model):
        raise ValueError(f"tessera.patch: {type(model).__name__} is already patched; call tessera.unpatch(model) "
                         "first")
    counts = dict.fromkeys(SWITCHES, 0)
    try:
        if family in DECODERS:
            _patch_decoder(model, family, flags, counts)
        else:
            from . import encoder
            before = len(_undo.steps(model))
            encoder.patch_encoder(model, flags["layer_norm"])
            counts["layer_norm"] = len(_undo.steps(model)) - before
        if flags["attention"]:
            from . import attention as attn
            attn.patch_attention(model)
            counts["attention"] = len(_attention_modules(model)) or \
                sum(type(m).__name__.endswith("SelfAttention") for m in model.modules())
        _check_counts(model, family, flags, counts)
    except BaseException:
        _undo.run_undo(model)
        raise
    object.__setattr__(model, "_tessera_counts", counts)
    return model


def unpatch(model):
    """Restore everything ``tessera.patch`` changed on ``model`` (a no-op on an unpatched model); returns it."""
    _undo.run_undo(model)
    model.__dict__.pop("_tessera_counts", None)
    return model


@contextlib.contextmanager
def patched(model, **switches):
    """``with tessera.patched(model, **switches): ...`` -- patched inside the block, restored after."""
    patch(model, **switches)
    try:
        yield model
    finally:
        unpatch(model)


def paged_cache(model, max_tokens: int, page_size: int = 16, dtype=None):
    """A transformers ``Cache`` on tessera's paged KV cache for ``model.generate(..., past_key_values=...)``.

    ``model`` must be patched with ``attention=True``; ``max_tokens`` bounds prompt + new tokens
    per sequence; ``dtype`` is the page dtype (default: the model's; int8 / float8_e4m3fn pages
    carry per-(token, head) scales).  Decode steps run ``tessera.append_kv`` and
    ``tessera.decode_attention``; see ``paged_cache.py``.
    """
    from .paged_cache import PagedKVCache
    return PagedKVCache(model, max_tokens, page_size, dtype)
