"""tessera.patch on every supported transformers family: patched logits, gradients and the
fused-linear-cross-entropy loss match the unpatched model (fp32 rule), the tessera:: ops
really run (a dispatch-mode count per forward), unpatch restores the original code exactly,
padding masks go through varlen attention, and what is not supported says so.

Tiny random-init models from configs (2 layers, hidden 64, vocab 128); no hub downloads.
"""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tessera  # noqa: E402
from tessera.testing.tolerance import FP32_ATOL, FP32_RTOL  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
W = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8)
# family -> (config class, model class, config extras): windows shorter than the 17-token inputs so the
# sliding-window layers really cut; Gemma 2's softcaps on; Phi-3 with a partial rotary
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=8,
                                                       max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(W, attn_logit_softcapping=0.5,
                                                         final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(W, layer_types=["sliding_attention",
                                                                             "full_attention"])),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5)),
    "bert": ("BertConfig", "BertForMaskedLM", dict(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)),
}


class OpCount(TorchDispatchMode):
    """Counts tessera:: ops (forward names, e.g. 'rms_norm') seen by the dispatcher."""

    def __init__(self):
        super().__init__()
        self.n: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tessera":
            name = func.name().split("::")[1].split(".")[0]
            self.n[name] = self.n.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def make(family: str, seed: int = 0):
    cfg_name, model_name, extra = FAMILIES[family]
    kw = dict(BASE, **extra)
    if family == "bert":
        kw.pop("num_key_value_heads")
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_name)(**kw)
    return getattr(transformers, model_name)(cfg).eval()


def close(a, b, what):
    torch.testing.assert_close(a, b, rtol=FP32_RTOL, atol=FP32_ATOL, msg=lambda m: f"{what}: {m}")


def close64(out, eager, ref64, what):
    """The fp32 rule on a whole model: ``out`` against the unpatched model run in float64, within
    torch.testing's fp32 defaults elementwise, or -- where a deep network's gradients amplify
    rounding beyond them (sums over tokens and layers: Gemma's softcapped embedding gradient) --
    within twice the unpatched fp32 model's own largest error plus one fp32 ulp of each element
    (the project's rule for fp16/bf16, tolerance.py, applied in fp32; the fuzz uses it too)."""
    o, e, r = out.double(), eager.double(), ref64.double()
    err = (o - r).abs()
    if bool((err <= FP32_ATOL + FP32_RTOL * r.abs()).all()):
        return
    bound = 2 * float((e - r).abs().max()) + torch.finfo(torch.float32).eps * r.abs()
    worst = float((err - bound).max())
    assert worst <= 0, (f"{what}: max error {float(err.max()):.3g} vs float64, unpatched fp32 error "
                        f"{float((e - r).abs().max()):.3g}; exceeds 2x that by {worst:.3g}")


def run(model, ids, labels=None, mask=None, probe=None):
    """(logits or loss, {param name: grad}) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    out = model(ids, attention_mask=mask, labels=labels)
    value = out.loss if labels is not None else out.logits
    loss = value if labels is not None else (value * probe).sum()
    loss.backward()
    return value.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_patched_matches_unpatched(family):
    model = make(family)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 17), generator=gen)
    probe = torch.randn(2, 17, 128, generator=gen)
    ref_logits, ref_grads = run(model, ids, probe=probe)
    ref_loss, ref_lgrads = run(model, ids, labels=ids) if family != "bert" else (None, None)
    m64 = copy.deepcopy(model).double()
    r64_logits, r64_grads = run(m64, ids, probe=probe.double())
    r64_loss, r64_lgrads = run(m64, ids, labels=ids) if family != "bert" else (None, None)

    assert tessera.patch(model) is model
    counts = model._tessera_counts
    layers = BASE["num_hidden_layers"]
    with OpCount() as seen:
        logits, grads = run(model, ids, probe=probe)
    # every swapped module ran its tessera op once per forward (and nothing else stayed in place)
    expected = {k: v for k, v in counts.items() if v and k != "loss"}
    expected["attention"] = layers
    assert {k: seen.n.get(k, 0) for k in expected} == expected, (seen.n, counts)
    assert seen.n.get("attention_backward") == layers, seen.n
    close64(logits, ref_logits, r64_logits, f"{family} logits")
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        close64(g, ref_grads[name], r64_grads[name], f"{family} grad {name}")

    if family != "bert":
        with OpCount() as seen:
            loss, lgrads = run(model, ids, labels=ids)
        assert seen.n.get("fused_linear_cross_entropy") == 1, seen.n
        close64(loss, ref_loss, r64_loss, f"{family} loss")
        assert lgrads.keys() == ref_lgrads.keys()
        for name, g in lgrads.items():
            close64(g, ref_lgrads[name], r64_lgrads[name], f"{family} loss grad {name}")

    tessera.unpatch(model)
    with OpCount() as seen:
        logits, _ = run(model, ids, probe=probe)
    assert seen.n == {}, f"unpatched {family} still runs tessera ops: {seen.n}"
    assert torch.equal(logits, ref_logits), "unpatch did not restore the original code"


@pytest.mark.parametrize("family,pad", [("llama", "left"), ("gemma2", "left"), ("bert", "right")])
def test_padding_mask_goes_varlen(family, pad):
    """Ragged rows (padding mask) match the unpatched model at every valid position."""
    model = make(family)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 128, (3, 17), generator=gen)
    mask = torch.ones(3, 17, dtype=torch.long)
    valid = torch.ones(3, 17, dtype=torch.bool)
    for row, n in ((1, 5), (2, 11)):
        cut = slice(0, n) if pad == "left" else slice(17 - n, 17)
        mask[row, cut] = 0
        valid[row, cut] = False
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
        with tessera.patched(model):
            out = model(ids, attention_mask=mask).logits
            assert model._tessera_counts["attention"]
        assert not hasattr(model, "_tessera_counts")
    close(out[valid], ref[valid], f"{family} {pad}-padded logits")


def test_patch_is_per_model():
    """A patched model does not change another model of the same family (shared rope global)."""
    from tessera.patch import _undo
    key = ("transformers.models.llama.modeling_llama", "apply_rotary_pos_emb")
    before = _undo._GLOBAL_SWAPS.get(key, [None, 0])[1]   # another live patched llama may hold it
    a, b = make("llama"), make("llama", seed=3)
    ids = torch.randint(3, 128, (1, 9))
    with torch.no_grad():
        ref_b = b(ids).logits
        with tessera.patched(a):
            with OpCount() as seen:
                out_b = b(ids).logits
            assert seen.n == {}, seen.n
            with OpCount() as seen:
                a(ids)
            assert seen.n.get("rope") == 2
    assert torch.equal(out_b, ref_b)
    import transformers.models.llama.modeling_llama as ml
    assert _undo._GLOBAL_SWAPS.get(key, [None, 0])[1] == before
    if before == 0:
        assert not hasattr(ml.apply_rotary_pos_emb, "__wrapped__"), "rope dispatcher left installed"


def test_switches_and_errors():
    model = make("llama")
    tessera.patch(model, rope=False, attention=False, loss=False)
    ids = torch.randint(3, 128, (1, 9))
    with torch.no_grad(), OpCount() as seen:
        model(ids)
    assert seen.n == {"rms_norm": 5, "swiglu": 2}, seen.n
    with pytest.raises(ValueError, match="already patched"):
        tessera.patch(model)
    tessera.unpatch(model)
    with pytest.raises(TypeError, match="'rope' must be a bool"):
        tessera.patch(model, rope=1)

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*'gpt2'.*llama"):
        tessera.patch(gpt2)

    model.train()
    model.config.attention_dropout = 0.1
    for m in model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.1
    with tessera.patched(model), pytest.raises(ValueError, match="dropout"):
        model(ids)


def test_import_tessera_does_not_import_transformers():
    code = "import sys, tessera; print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bf16_logits_within_twice_transformers_error(family):
    """bf16 models: the patched logits' error against the float64 model is at most twice the
    unpatched bf16 model's own (the project's low-precision rule, FlashAttention's), + 1 bf16 ulp."""
    model, m64 = make(family).to(torch.bfloat16), make(family).double()
    ids = torch.randint(3, 128, (2, 17), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        r64 = m64(ids).logits
        eager = model(ids).logits.double()
        with tessera.patched(model):
            out = model(ids).logits.double()
    e = float((eager - r64).abs().max())
    err = (out - r64).abs()
    assert bool((err <= 2 * e + torch.finfo(torch.bfloat16).eps * r64.abs()).all()), \
        f"{family} bf16: patched error {float(err.max()):.3g}, transformers bf16 error {e:.3g}"


def test_deepcopy_of_patched_model():
    """A deep copy of a patched model runs patched on its own modules and unpatches on its own."""
    model = tessera.patch(make("qwen3"))
    twin = copy.deepcopy(model)
    ids = torch.randint(3, 128, (1, 9))
    tessera.unpatch(model)
    with torch.no_grad():
        ref = model(ids).logits
        with OpCount() as seen:
            out = twin(ids).logits
        assert seen.n.get("rope") == 2 and seen.n.get("rms_norm") == 9, seen.n
        close(out, ref, "deep copy")
        tessera.unpatch(twin)
        with OpCount() as seen:
            assert torch.equal(twin(ids).logits, ref)
        assert seen.n == {}
