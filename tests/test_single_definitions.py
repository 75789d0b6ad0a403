"""Tables and helpers that several ops share have one definition (issue #13's duplicates): a
second copy can drift from the first without any test noticing."""
from __future__ import annotations

import inspect

import torch

from tessera.ops import _qlinear_int4, linear_fp8
from tessera.ops._qlinear_int8 import ref as int8_ref
from tessera.ops.append_kv import cpu as append_cpu
from tessera.ops.decode_attention import cpu as decode_cpu
from tessera.ops.linear_fp8 import ref as fp8_ref
from tessera.quant import RECIPES, model


def test_activations_defined_once():
    assert fp8_ref.ACTIVATIONS is int8_ref.ACTIVATIONS
    assert _qlinear_int4.ACTIVATIONS is int8_ref.ACTIVATIONS
    assert linear_fp8.ACTIVATIONS is int8_ref.ACTIVATIONS  # the op's checks read the same tuple


def test_cache_codes_defined_once():
    """decode_attention reads the KV cache append_kv writes: one table of the C dtype codes."""
    assert decode_cpu.CACHE_CODE is append_cpu.CACHE_CODE


def test_model_dequantize_weight_uses_the_ops_dequantisers():
    """tessera.quant.model.dequantize_weight has no scale-expansion code of its own: it calls the
    int4 and the row/block-scaled dequantisers of the ops, and agrees with them bit for bit."""
    src = inspect.getsource(model.dequantize_weight)
    assert "repeat_interleave" not in src and "unpack_int4" not in src
    w = torch.randn(130, 256, generator=torch.Generator().manual_seed(0))
    for recipe in RECIPES:
        bufs = model.quantize_weight(w, recipe)
        got = model.dequantize_weight(bufs, recipe)
        if RECIPES[recipe].kind == "int4":
            want = _qlinear_int4.dequantize_weight(bufs["weight"], bufs["weight_scale"], bufs.get("weight_zero"),
                                                   RECIPES[recipe].group)
        else:
            want = fp8_ref.dequantize_weight(bufs["weight"], bufs["weight_scale"], torch.float32)
        assert torch.equal(got, want), recipe
