"""Convergence of patched models, as Liger-Kernel tests it: a mini Llama and a mini Qwen3
(4 layers, from a config, random init) trained for 32 AdamW steps on deterministic synthetic
tokens, patched (every switch on: norms, SwiGLU, RoPE, attention, fused linear cross-entropy)
against unpatched from the same initial weights.

The data has structure a model can learn: each sequence walks a fixed random permutation of
the vocabulary (token t+1 = perm[token t]) from a random start, with 1 token in 8 replaced by
noise, so the bigram table is learnable and the loss falls well below log(vocab).

Agreement (fp32): per-step loss rtol 2e-5 (the issue's figure), the top-5 log-probs of held-out
sequences after training rtol 2e-5 / atol 1e-5 with the same top-5 indices, and the final
parameters within atol 1e-3 (AdamW moves each element by up to ~lr per step whatever the
gradient's size -- it divides by sqrt(v) -- so elements whose gradients are ~0 and differ in
rounding move differently; 1e-3 is 1 % of the 32 * lr = 0.096 an element can move, and the
largest difference measured is 7e-5).  ~5 s for both families on the 2-core VM.

bf16 (model and AdamW state in bf16, as a bf16-only run trains): per-step loss atol 1e-2 and
rtol 1e-2 (the issue asks atol 1e-2, rtol 5e-2; measured on this VM: at most 0.016 absolute and
0.44 % relative over the 32 steps), the sorted top-5 held-out log-probs within 0.25 (measured
0.13: one bf16 ulp of a logit near 8 is 0.03, and rounding differences compound over 32 steps;
the top-5 *indices* are not compared, bf16 logits tie), and the final parameters within 0.05
(measured 0.026; one bf16 ulp at 1.0 is 0.0078).
"""
from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tessera  # noqa: E402

VOCAB, SEQ, BATCH, STEPS = 128, 32, 8, 32
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16))}


def synthetic(gen: torch.Generator, batch: int) -> torch.Tensor:
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1234))
    seq = torch.empty(batch, SEQ, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (batch,), generator=gen)
    for t in range(1, SEQ):
        seq[:, t] = perm[seq[:, t - 1]]
    noise = torch.rand(batch, SEQ, generator=gen) < 0.125
    seq[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=gen)
    return seq


def train(model) -> list[float]:
    gen = torch.Generator().manual_seed(7)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for _ in range(STEPS):
        ids = synthetic(gen, BATCH)
        loss = model(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


# dtype: (loss rtol, loss atol, held-out log-prob rtol, atol, final-parameter atol)
RULES = {torch.float32: (2e-5, 0.0, 2e-5, 1e-5, 1e-3), torch.bfloat16: (1e-2, 1e-2, 0.0, 0.25, 5e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_convergence_patched_vs_unpatched(family, dtype):
    cfg_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    plain = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**CONFIG, **extra))
    plain = plain.train().to(dtype)
    fast = tessera.patch(copy.deepcopy(plain))
    try:
        _train_and_compare(family, plain, fast, *RULES[dtype])
    finally:
        tessera.unpatch(fast)


def _train_and_compare(family, plain, fast, loss_rtol, loss_atol, lp_rtol, lp_atol, param_atol):
    assert all(fast._tessera_counts[k] for k in ("rms_norm", "swiglu", "rope", "attention", "loss"))
    ref, got = train(plain), train(fast)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=loss_rtol, atol=loss_atol)
    assert ref[-1] < 0.6 * ref[0] and ref[0] > 4.0, f"the loss did not fall: {ref[0]:.3f} -> {ref[-1]:.3f}"
    assert got[-1] < 0.6 * got[0], f"the patched loss did not fall: {got[0]:.3f} -> {got[-1]:.3f}"

    held = synthetic(torch.Generator().manual_seed(99), 4)
    with torch.no_grad():
        lp_ref = torch.log_softmax(plain.eval()(held).logits.float(), -1).topk(5, dim=-1)
        lp_got = torch.log_softmax(fast.eval()(held).logits.float(), -1).topk(5, dim=-1)
    if lp_rtol:  # fp32: the same top-5 tokens; bf16 logits tie, so only the values are compared
        assert torch.equal(lp_got.indices, lp_ref.indices)
    torch.testing.assert_close(lp_got.values, lp_ref.values, rtol=lp_rtol, atol=lp_atol)

    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        err = float((p.detach().float() - q.detach().float()).abs().max())
        assert err <= param_atol, f"{family} {name}: final parameters differ by {err:.3g}"
