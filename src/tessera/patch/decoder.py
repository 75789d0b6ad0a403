"""Decoder-only families (Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, Phi-3): norms, gated MLPs
and the causal-LM loss on tessera ops, as per-instance ``forward`` overrides.

* RMSNorm -> ``tessera.rms_norm(x, weight, eps)``.  Llama-style modules scale by ``weight``;
  Gemma's scale by ``1 + weight`` (weights stored as offsets from 1, initialised to 0), passed
  as the fp32 tensor ``1 + weight.float()`` so autograd carries the gradient to the offset and a
  bf16 model's scale is not rounded to bf16 first (1 + 0.01 would become 1.0078; the kernels
  take an fp32 weight with a bf16 x, and the result then equals transformers' bit for bit).  Qwen3's
  q_norm/k_norm (RMSNorm over head_dim on (B, S, H, D)) are RMSNorm modules like the others.
  transformers rounds Llama's normalised x to the input dtype before the weight product and
  Gemma's after it; tessera rounds once at the end (the same in fp32, within the fp16/bf16
  rule otherwise).
* MLP ``down(act(gate(x)) * up(x))`` -> ``down(tessera.swiglu(gate(x), up(x)))`` for
  ``silu``, ``tessera.geglu(..., approximate)`` for ``gelu`` / ``gelu_pytorch_tanh``
  (Gemma); Phi-3's fused ``gate_up_proj`` is split into its two halves first.  Any other
  activation is a ValueError naming it (patch with swiglu=False/geglu=False).
* Causal-LM loss: when ``labels`` are given, ``*ForCausalLM.forward`` runs the base model and
  ``tessera.fused_linear_cross_entropy`` on the final hidden states and ``lm_head`` (with
  Gemma's ``final_logit_softcapping`` as its softcap), so the (tokens x vocab) logits never
  exist; labels are shifted as transformers' ``ForCausalLMLoss`` does (pad with -100, drop
  the first), ``shift_labels`` / ``num_items_in_batch`` / ``ignore_index`` are honoured
  (sum / num_items_in_batch when given, else the mean over non-ignored tokens).  The output
  then carries ``logits=None`` (Liger's choice: materialising them would undo the saving);
  without labels the original forward runs and returns logits.
"""
from __future__ import annotations

import torch

from . import _undo

_ACTS = {"silu": ("swiglu", None), "swish": ("swiglu", None), "gelu": ("geglu", "none"),
         "gelu_pytorch_tanh": ("geglu", "tanh"), "gelu_new": ("geglu", "tanh")}


def _tessera():
    import tessera
    return tessera


def _eps(module) -> float:
    for name in ("variance_epsilon", "eps", "epsilon"):
        if hasattr(module, name):
            return float(getattr(module, name))
    raise ValueError(f"tessera.patch: {type(module).__name__} has no eps attribute (variance_epsilon/eps)")


def _rms_forward(self, x):
    return _tessera().rms_norm(x, self.weight, self._tessera_eps)


def _rms_offset_forward(self, x):   # Gemma: x / rms * (1 + w), the scale formed in fp32 as transformers does
    return _tessera().rms_norm(x, 1.0 + self.weight.float(), self._tessera_eps)


def patch_rms_norm(model, module, offset: bool) -> None:
    if getattr(module, "weight", None) is None:
        raise ValueError(f"tessera.patch: {type(module).__name__} has no weight; patch with rms_norm=False")
    object.__setattr__(module, "_tessera_eps", _eps(module))
    _undo.override_forward(model, module, _rms_offset_forward if offset else _rms_forward)


def _activation(config, module) -> str:
    for name in ("hidden_activation", "hidden_act"):
        act = getattr(config, name, None)
        if act is not None:
            return act
    raise ValueError(f"tessera.patch: cannot find the activation of {type(module).__name__} in the config")


def _gated(op: str, approximate):
    t = _tessera()
    if op == "swiglu":
        return t.swiglu
    return lambda gate, up: t.geglu(gate, up, approximate=approximate)


def patch_mlp(model, module, config, swiglu: bool, geglu: bool) -> bool:
    """Swap a gated MLP's activation product; returns False when the switch for its kind is off."""
    act = _activation(config, module)
    if act not in _ACTS:
        raise ValueError(f"tessera.patch: {type(module).__name__} uses activation {act!r}; tessera has gated "
                         f"kernels for {sorted(_ACTS)} -- patch with swiglu=False, geglu=False")
    op, approximate = _ACTS[act]
    if not (swiglu if op == "swiglu" else geglu):
        return False
    fn = _gated(op, approximate)
    if hasattr(module, "gate_up_proj"):          # Phi-3: one projection, [gate | up]
        def forward(self, x):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(fn(gate, up))
    elif all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")):
        def forward(self, x):
            return self.down_proj(fn(self.gate_proj(x), self.up_proj(x)))
    else:
        raise ValueError(f"tessera.patch: {type(module).__name__} has neither gate_proj/up_proj/down_proj nor "
                         "gate_up_proj/down_proj; patch with swiglu=False, geglu=False")
    _undo.override_forward(model, module, forward)
    return True


def lm_loss(hidden, weight, bias, labels, softcap: float, shift_labels=None, num_items_in_batch=None,
            ignore_index: int = -100):
    """transformers' ForCausalLMLoss on ``tessera.fused_linear_cross_entropy`` (no logits)."""
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    target = shift_labels.reshape(-1).to(hidden.device)
    h = hidden.reshape(-1, hidden.shape[-1])
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = _tessera().fused_linear_cross_entropy(h, weight, target, bias, ignore_index=ignore_index,
                                                 softcap=float(softcap or 0.0), reduction=reduction)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                       inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    if labels is None:
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                  position_ids=position_ids, past_key_values=past_key_values,
                                  inputs_embeds=inputs_embeds, use_cache=use_cache, logits_to_keep=logits_to_keep,
                                  **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast
    shift = kwargs.pop("shift_labels", None)
    items = kwargs.pop("num_items_in_batch", None)
    ignore = kwargs.pop("ignore_index", -100)
    return_dict = kwargs.pop("return_dict", None)
    out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    head = self.lm_head
    loss = lm_loss(out.last_hidden_state, head.weight, head.bias, labels,
                   getattr(self.config, "final_logit_softcapping", None), shift, items, ignore)
    result = CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=out.past_key_values,
                                    hidden_states=out.hidden_states, attentions=out.attentions)
    return result.to_tuple() if return_dict is False else result


def patch_causal_lm_loss(model) -> None:
    """Override ``model.forward`` (a *ForCausalLM with ``.model`` and ``.lm_head``) for labelled calls."""
    _undo.override_forward(model, model, _causal_lm_forward)
