"""BERT-style encoders: LayerNorm (with the residual add fused) on tessera ops.

* Every ``nn.LayerNorm`` -> ``tessera.layer_norm(x, weight, bias, eps)`` (also the
  embeddings' and the MLM head's).
* BERT's post-norm residual blocks (``BertSelfOutput``, ``BertOutput``: ``dense`` ->
  ``dropout`` -> ``LayerNorm(h + input)``) -> ``tessera.layer_norm(h, w, b, eps,
  residual=input)``: the add happens inside the kernel (one pass over the row instead of an
  add kernel plus a norm kernel; tessera's (y, h + input) pair keeps the sum for the
  backward).
* Attention goes through the registry (``attention.py``; ``is_causal`` False, the padding
  mask as varlen).  BERT's intermediate GELU is not gated and stays as it is.
"""
from __future__ import annotations

from torch import nn

from . import _undo


def _tessera():
    import tessera
    return tessera


def _ln_forward(self, x):
    return _tessera().layer_norm(x, self.weight, self.bias, self.eps)


def patch_layer_norm(model, module: nn.LayerNorm) -> None:
    if len(module.normalized_shape) != 1:
        raise ValueError(f"tessera.patch: LayerNorm over {tuple(module.normalized_shape)} (more than the last dim) "
                         "is not supported; patch with layer_norm=False")
    _undo.override_forward(model, module, _ln_forward)


def _residual_forward(self, hidden_states, input_tensor):
    h = self.dropout(self.dense(hidden_states))
    ln = self.LayerNorm
    return _tessera().layer_norm(h, ln.weight, ln.bias, ln.eps, residual=input_tensor)[0]


def is_residual_block(module) -> bool:
    """A ``dense`` -> ``dropout`` -> ``LayerNorm(h + input)`` block (BertSelfOutput / BertOutput)."""
    return (type(module).__name__.endswith(("SelfOutput", "Output")) and isinstance(getattr(module, "dense", None),
            nn.Linear) and isinstance(getattr(module, "LayerNorm", None), nn.LayerNorm)
            and isinstance(getattr(module, "dropout", None), nn.Dropout))


def patch_encoder(model, layer_norm: bool) -> None:
    if not layer_norm:
        return
    fused = set()
    for module in model.modules():
        if is_residual_block(module):
            _undo.override_forward(model, module, _residual_forward)
            fused.add(id(module.LayerNorm))
    for module in model.modules():
        if isinstance(module, nn.LayerNorm) and id(module) not in fused:
            patch_layer_norm(model, module)
