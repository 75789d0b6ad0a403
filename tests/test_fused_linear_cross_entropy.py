"""``tessera.fused_linear_cross_entropy`` beyond the spec-generated tests.

* chunk boundaries: with ``TESSERA_FLCE_CHUNK_BYTES`` forcing chunks of a few tokens (token
  counts not a multiple of the chunk, chunks of one token), every backend and reduction against
  the unfused float64 reference, gradients of hidden / weight / bias included (the matrix's
  cases fit in one chunk);
* the logits are never materialised: no allocation of tokens x vocab elements (the CPU
  profiler's allocation records), forward and backward;
* only the gradients asked for: a frozen weight skips the dweight GEMM; reduction="none"
  recomputes in backward with a non-uniform upstream gradient; ``loss.backward()`` (upstream
  1) and a retained graph differentiated again with another upstream gradient;
* errors: weight / bias shapes, dtype mismatch, targets out of range;
* a hypothesis fuzz of random sizes / options / layouts / chunking (cpu and, small, triton)
  against the float64 reference.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera.backends import triton as triton_backend
from tessera.ops.fused_linear_cross_entropy import chunks
from tessera.ops.fused_linear_cross_entropy import spec as flce_spec
from tessera.testing.matrix import run_case

SPEC = tessera.OPS["fused_linear_cross_entropy"]
BACKENDS = ["reference", "cpu"] + (["triton"] if triton_backend.interpreted() else [])
FLOAT_BACKENDS = [b for b in BACKENDS if b != "reference"]  # the ones that chunk


def _chunk_of(monkeypatch, tokens, V, dtype=torch.float32):
    """Make chunk_tokens() return ``tokens`` for a V-vocabulary fp32 logits chunk."""
    monkeypatch.setenv("TESSERA_FLCE_CHUNK_BYTES", str(tokens * V * dtype.itemsize))


def test_chunk_tokens():
    """<= 256 MiB of logits (with the fp32 copy for dweight in fp16), >= 32 MiB, 8 chunks between."""
    assert chunks.chunk_tokens(8192, 128256, torch.float32, True) == (256 << 20) // (128256 * 4) == 523
    assert chunks.chunk_tokens(8192, 128256, torch.float16, True) == (256 << 20) // (128256 * 6)
    assert chunks.chunk_tokens(8192, 128256, torch.bfloat16, True) == 8192 // 8   # under 256 MiB
    assert chunks.chunk_tokens(2048, 32000, torch.float32, True) == (32 << 20) // (32000 * 4) == 262
    assert chunks.chunk_tokens(4096, 32000, torch.float32, True) == 512       # 8 chunks
    assert chunks.chunk_tokens(10, 32000, torch.float32, True) == 10
    assert chunks.chunk_tokens(5, 10 ** 9, torch.float32, True) == 1   # at least one token


@pytest.mark.parametrize("backend", FLOAT_BACKENDS)
@pytest.mark.parametrize("chunk", [1, 3, 7])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunk_boundaries_match_unfused_reference(backend, chunk, reduction, monkeypatch):
    """17 tokens in chunks of 1, 3 (17 = 5 x 3 + 2) and 7 tokens; ignored targets fall in
    several chunks; the mean's 1/n is over the whole batch, not the chunk."""
    _chunk_of(monkeypatch, chunk, 123)
    assert chunks.chunk_tokens(17, 123, torch.float32, True) == chunk
    case = flce_spec._case(f"chunks-{chunk}", (17,), 24, 123, ignored=0.3, reduction=reduction,
                           label_smoothing=0.1, z_loss=1e-3, softcap=20.0, scale=3.0)
    for dtype in SPEC.dtypes:
        r = run_case(SPEC, backend, dtype, case)
        assert r.ok, f"{dtype}: {r.why}"


@pytest.mark.parametrize("backend", FLOAT_BACKENDS)
def test_bf16_chunks_with_leading_dims_and_no_bias(backend, monkeypatch):
    """Also bf16's dweight in blocks of 10 vocabulary rows (77 = 7 x 10 + 7) per chunk."""
    _chunk_of(monkeypatch, 4, 77, torch.bfloat16)
    monkeypatch.setattr(chunks, "PARTIAL_BYTES", 10 * 16 * 2)
    case = flce_spec._case("chunks-3d", (2, 9), 16, 77, bias=False, ignored=0.2)
    for dtype in SPEC.dtypes:
        r = run_case(SPEC, backend, dtype, case)
        assert r.ok, f"{dtype}: {r.why}"


def _inputs(T=40, H=16, V=500, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g)
    w = torch.randn(V, H, generator=g) / H ** 0.5
    b = torch.randn(V, generator=g) if bias else None
    t = torch.randint(0, V, (T,), generator=g)
    t[::5] = -100
    return h, w, b, t


def _unfused(h, w, b, t, **kw):
    return F.cross_entropy(F.linear(h, w, b), t, **kw)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_the_logits_are_never_materialised(reduction, monkeypatch):
    """No single allocation holds the 40 x 500 logits, in forward or backward: the largest ones
    are the fp32 dweight (500 x 16) and one chunk (8 x 500); the unfused pair allocates the full
    logits (checked too: the probe can see them)."""
    T, H, V = 40, 16, 500
    _chunk_of(monkeypatch, 8, V)
    h, w, b, t = _inputs(T, H, V)

    def biggest(fn):
        hh, ww, bb = (x.clone().requires_grad_(True) for x in (h, w, b))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as p:
            loss = fn(hh, ww, bb)
            loss.backward(torch.ones_like(loss) * 0.5)
        return max(e.self_cpu_memory_usage for e in p.events())  # one op's own allocation

    logits_bytes = T * V * 4
    assert biggest(lambda hh, ww, bb: _unfused(hh, ww, bb, t, reduction=reduction)) >= logits_bytes
    got = biggest(lambda hh, ww, bb: tessera.fused_linear_cross_entropy(hh, ww, t, bb, reduction=reduction,
                                                                        backend="cpu"))
    assert 8 * V * 4 <= got <= max(8 * V * 4, V * H * 4) < logits_bytes / 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_weight_skips_its_gradient(backend, monkeypatch):
    h, w, b, t = _inputs()
    seen = []
    orig = chunks.sweep

    def spy(*a, **k):
        seen.append(a[6:9])  # need_dh, need_dw, need_db
        return orig(*a, **k)
    monkeypatch.setattr(chunks, "sweep", spy)
    hh = h.clone().requires_grad_(True)
    loss = tessera.fused_linear_cross_entropy(hh, w, t, b, backend=backend)
    loss.backward()
    hr = h.clone().requires_grad_(True)
    _unfused(hr, w, b, t).backward()
    torch.testing.assert_close(hh.grad, hr.grad, rtol=1e-5, atol=1e-6)
    if backend != "reference":
        assert seen == [(True, False, False)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduction_none_recomputes_with_each_rows_gradient(backend, monkeypatch):
    _chunk_of(monkeypatch, 6, 500)
    h, w, b, t = _inputs()
    up = torch.randn(t.shape, generator=torch.Generator().manual_seed(5)) * 4
    a = [x.clone().requires_grad_(True) for x in (h, w, b)]
    r = [x.double().requires_grad_(True) for x in (h, w, b)]
    loss = tessera.fused_linear_cross_entropy(a[0], a[1], t, a[2], reduction="none", backend=backend)
    want = _unfused(*r, t, reduction="none")
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-5, atol=1e-5)
    for ga, gr in zip(torch.autograd.grad(loss, a, up), torch.autograd.grad(want, r, up.double())):
        torch.testing.assert_close(ga.double(), gr, rtol=1e-5, atol=1e-5)
    assert torch.all(loss[t == -100] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_of_one_and_a_retained_graph(backend):
    h, w, b, t = _inputs(seed=2)
    a = [x.clone().requires_grad_(True) for x in (h, w, b)]
    loss = tessera.fused_linear_cross_entropy(a[0], a[1], t, a[2], backend=backend)
    g1 = torch.autograd.grad(loss, a, retain_graph=True)
    g3 = torch.autograd.grad(loss, a, torch.tensor(3.0))
    r = [x.clone().requires_grad_(True) for x in (h, w, b)]
    want = torch.autograd.grad(_unfused(*r, t), r)
    for x, y, z in zip(g1, g3, want):
        torch.testing.assert_close(x, z, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(y, 3 * z, rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("kw,exc,needle", [
    ({"weight": torch.randn(10, 7)}, ValueError, r"'weight'.*\(10, 7\)"),
    ({"weight": torch.randn(8)}, ValueError, r"'weight'.*\(8,\)"),
    ({"weight": torch.randn(0, 8)}, ValueError, r"'weight'.*\(0, 8\)"),
    ({"weight": torch.randn(10, 8).half()}, TypeError, r"'weight'.*float16"),
    ({"bias": torch.randn(11)}, ValueError, r"'bias'.*\(11,\)"),
    ({"bias": torch.randn(10).half()}, TypeError, r"'bias'.*float16"),
    ({"target": torch.tensor([0, 10, 1])}, ValueError, r"'target'.*10.*\[0, 10\)"),
    ({"target": torch.tensor([0, 1])}, ValueError, r"'target'.*\(2,\)"),
    ({"target": torch.tensor([0.0, 1.0, 2.0])}, TypeError, r"'target'.*float32"),
    ({"reduction": "max"}, ValueError, "'reduction'"),
    ({"label_smoothing": 2.0}, ValueError, "'label_smoothing'"),
])
def test_errors(kw, exc, needle):
    args = {"hidden": torch.randn(3, 8), "weight": torch.randn(10, 8), "target": torch.tensor([0, 9, -100]),
            "bias": torch.randn(10), **kw}
    for backend in ("cpu", "reference"):
        with pytest.raises(exc, match=needle):
            tessera.fused_linear_cross_entropy(**args, backend=backend)


# ---------------------------------------------------------------- fuzz (vs the float64 reference)

EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25"))
TRITON_EXAMPLES = int(os.environ.get("TESSERA_FUZZ_TRITON_EXAMPLES", "8"))


@st.composite
def _fuzz_case(draw, max_logits=40_000):
    lead = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=2)))
    if draw(st.integers(0, 15)) == 0:
        lead = (0,)
    H = draw(st.integers(1, 64))
    V = draw(st.integers(1, 300) | st.sampled_from([2047, 2049, 4099]))
    while len(lead) > 1 and V * torch.Size(lead).numel() > max_logits:
        lead = lead[1:]
    opts = {"reduction": draw(st.sampled_from(["mean", "sum", "none"]))}
    for k, values in (("label_smoothing", [0.1, 1.0]), ("z_loss", [1e-4, 1e-2]), ("softcap", [2.0, 30.0]),
                      ("ignore_index", [0, -1])):
        if draw(st.booleans()):
            opts[k] = draw(st.sampled_from(values))
    layout = draw(st.sampled_from(["contig", "rowslice", "transposed", "offset"]))
    w_layout = draw(st.sampled_from(["contig", "transposed"]))
    chunk = draw(st.sampled_from([None, 1, 2, 5]))
    case = flce_spec._case(f"fuzz-{lead}-h{H}-v{V}-{layout}/{w_layout}-chunk{chunk}-{opts}", lead, H, V,
                           bias=draw(st.booleans()), layout=layout, w_layout=w_layout,
                           scale=draw(st.sampled_from([0.3, 1.0, 6.0])), ignored=draw(st.sampled_from([0.0, 0.3, 1.0])),
                           int32=draw(st.booleans()), **opts)
    return draw(st.sampled_from(SPEC.dtypes)), case, chunk, V


def _run(drawn, backend):
    dtype, case, chunk, V = drawn
    old = os.environ.get("TESSERA_FLCE_CHUNK_BYTES")
    if chunk:  # a few tokens per chunk (or the default budget: one chunk)
        os.environ["TESSERA_FLCE_CHUNK_BYTES"] = str(chunk * V * dtype.itemsize)
    try:
        r = run_case(SPEC, backend, dtype, case, fp32_eager=True)
    finally:
        if old is None:
            os.environ.pop("TESSERA_FLCE_CHUNK_BYTES", None)
        else:
            os.environ["TESSERA_FLCE_CHUNK_BYTES"] = old
    assert r.ok, f"{case.name} {dtype}: {r.why}"


_SETTINGS = dict(deadline=None, derandomize=os.environ.get("TESSERA_FUZZ_RANDOM") != "1", database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(drawn=_fuzz_case())
def test_fuzz_fused_linear_cross_entropy_cpu_vs_reference(drawn):
    _run(drawn, "cpu")


@pytest.mark.skipif(not triton_backend.interpreted(), reason="triton runs here only under TRITON_INTERPRET=1")
def test_fuzz_fused_linear_cross_entropy_triton_vs_reference():
    """The same fuzz on the Triton interpreter: its own small budget (TESSERA_FUZZ_TRITON_EXAMPLES),
    kept out of `-m fuzz` like tests/test_fuzz.py's Triton variant (@given is built in here)."""
    @settings(max_examples=TRITON_EXAMPLES, **_SETTINGS)
    @given(drawn=_fuzz_case(max_logits=3000))
    def check(drawn):
        _run(drawn, "triton")

    check()
