"""``tessera.cross_entropy`` beyond the spec-generated tests.

* reduction="none" with a non-uniform upstream gradient (Liger's users got wrong gradients
  there): every backend against ``F.cross_entropy``'s autograd, including ignored rows;
* agreement with ``F.cross_entropy`` itself (ignore_index, label smoothing, every reduction,
  the all-ignored mean: NaN loss, zero gradient);
* targets out of range: a ValueError naming 'target' from every backend, and the CPU kernel's
  own check (no out-of-bounds read even when called directly);
* option errors; the lse is not differentiable;
* the gradient is written in the forward: no gradient buffer without grad, ``loss.backward()``
  returns the saved gradient without a copy, a retained graph can be differentiated twice;
* a hypothesis fuzz of random shapes / options / layouts (cpu and, small, triton) against the
  float64 reference (targets are indices: the generic row fuzz cannot build them).
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
from tessera.ops.cross_entropy import spec as ce_spec
from tessera.testing.matrix import run_case

SPEC = tessera.OPS["cross_entropy"]
BACKENDS = ["reference", "cpu"] + (["triton"] if triton_backend.interpreted() else [])


def _data(M=37, V=301, seed=0, ignored=0.25, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, V, generator=g) * 3).to(dtype)
    t = torch.randint(0, V, (M,), generator=g)
    t[torch.rand(M, generator=g) < ignored] = -100
    return x, t


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_reduction_none_gradient_is_per_row(backend, smoothing):
    x, t = _data()
    up = torch.randn(t.shape, generator=torch.Generator().manual_seed(1)) * 5   # very non-uniform
    xa = x.clone().requires_grad_(True)
    loss = tessera.cross_entropy(xa, t, label_smoothing=smoothing, reduction="none", backend=backend)
    (g,) = torch.autograd.grad(loss, xa, up)
    xb = x.double().requires_grad_(True)
    want = F.cross_entropy(xb, t, label_smoothing=smoothing, reduction="none")
    (gw,) = torch.autograd.grad(want, xb, up.double())
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g.double(), gw, rtol=1e-5, atol=1e-6)
    assert torch.all(g[t == -100] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch_cross_entropy(backend, reduction):
    x, t = _data(seed=3)
    for kw in ({}, {"label_smoothing": 0.1}, {"ignore_index": 7}):
        tt = t.clone()
        if "ignore_index" in kw:
            tt[::3] = 7
            tt[tt == -100] = 5
        xa, xb = x.clone().requires_grad_(True), x.double().requires_grad_(True)
        got = tessera.cross_entropy(xa, tt, reduction=reduction, backend=backend, **kw)
        want = F.cross_entropy(xb, tt, reduction=reduction, **kw)
        up = torch.rand(got.shape, generator=torch.Generator().manual_seed(2)) + 0.5
        (ga,) = torch.autograd.grad(got, xa, up)
        (gb,) = torch.autograd.grad(want, xb, up.double())
        torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ga.double(), gb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_ignored_mean_is_nan_with_zero_gradient(backend):
    x = torch.randn(5, 9, requires_grad=True)
    t = torch.full((5,), -100)
    loss = tessera.cross_entropy(x, t, backend=backend)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x.detach(), t))   # torch's convention
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert float(tessera.cross_entropy(x.detach(), t, reduction="sum", backend=backend)) == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [9, 1000, -1, -101])
def test_target_out_of_range_is_a_clear_error(backend, bad):
    x, t = torch.randn(4, 9), torch.tensor([0, 8, -100, 3])
    t[1] = bad
    with pytest.raises(ValueError, match=rf"'target'.*{bad}.*\[0, 9\)"):
        tessera.cross_entropy(x, t, backend=backend)
    x.requires_grad_(True)
    with pytest.raises(ValueError, match="'target'"):
        tessera.cross_entropy(x, t, backend=backend)


def test_cpu_kernel_checks_targets_itself():
    """Called directly (past the glue's check), the C kernel skips a bad row and reports it:
    nothing is read outside the row."""
    from tessera.ops.cross_entropy import cpu
    x = torch.randn(3, 5)
    for bad in (5, -7, 1 << 40):
        t = torch.tensor([1, bad, 2])
        with pytest.raises(ValueError, match="outside"):
            cpu.loss_rows(x, t, -100, 0.0, 0.0, 0.0, torch.empty(3, 5), 1.0)


@pytest.mark.parametrize("kw,exc,needle", [
    ({"label_smoothing": 1.5}, ValueError, "'label_smoothing'"),
    ({"label_smoothing": -0.1}, ValueError, "'label_smoothing'"),
    ({"z_loss": -1.0}, ValueError, "'z_loss'"),
    ({"softcap": float("nan")}, ValueError, "'softcap'"),
    ({"softcap": "30"}, TypeError, "'softcap'"),
    ({"ignore_index": True}, TypeError, "'ignore_index'"),
    ({"ignore_index": -100.0}, TypeError, "'ignore_index'"),
    ({"reduction": 3}, TypeError, "'reduction'"),
    ({"reduction": "avg"}, ValueError, "'reduction'"),
])
def test_option_errors(kw, exc, needle):
    with pytest.raises(exc, match=needle):
        tessera.cross_entropy(torch.randn(3, 4), torch.tensor([0, 1, 2]), **kw)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"'target'.*\(3, 2\)"):
        tessera.cross_entropy(torch.randn(3, 4), torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"'logits'.*\(3, 0\)"):
        tessera.cross_entropy(torch.randn(3, 0), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="'target'"):
        tessera.cross_entropy(torch.randn(3, 4), [0, 1, 2])


def test_lse_is_returned_and_not_differentiable():
    x, t = _data(M=6, V=50)
    x.requires_grad_(True)
    loss, lse = tessera.cross_entropy(x, t, softcap=10.0, return_lse=True, backend="cpu")
    assert lse.dtype == torch.float32 and lse.shape == t.shape and not lse.requires_grad
    want = torch.logsumexp(10.0 * torch.tanh(x.detach().double() / 10.0), -1)
    torch.testing.assert_close(lse.double(), want, rtol=1e-6, atol=1e-6)   # ignored rows included


def test_no_gradient_buffer_without_grad():
    x, t = _data(M=4, V=20)
    op = torch.ops.tessera.cross_entropy
    _, _, d = op(x, t, -100, 0.0, 0.0, 0.0, "mean", False, "cpu")
    assert d.numel() == 0
    _, _, d = op(x, t, -100, 0.0, 0.0, 0.0, "mean", True, "cpu")
    assert d.shape == x.shape


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_backward_of_one_returns_the_saved_gradient(backend):
    x, t = _data(M=8, V=40)
    x.requires_grad_(True)
    loss = tessera.cross_entropy(x, t, backend=backend)
    loss.backward()
    xb = x.detach().clone().requires_grad_(True)
    F.cross_entropy(xb, t).backward()
    torch.testing.assert_close(x.grad, xb.grad, rtol=1e-5, atol=1e-7)
    # upstream 1: the forward's buffer is the gradient (no copy); 2 * it otherwise
    x2 = x.detach().clone().requires_grad_(True)
    loss = tessera.cross_entropy(x2, t, reduction="sum", backend=backend)
    (g1,) = torch.autograd.grad(loss, x2, retain_graph=True)
    (g2,) = torch.autograd.grad(loss, x2, torch.tensor(2.0))
    torch.testing.assert_close(g2, 2 * g1)


def test_int32_targets_and_leading_dims():
    x, t = _data(M=24, V=33)
    got = tessera.cross_entropy(x.view(2, 3, 4, 33), t.view(2, 3, 4).to(torch.int32), reduction="none",
                                backend="cpu")
    assert got.shape == (2, 3, 4)
    torch.testing.assert_close(got.reshape(-1), F.cross_entropy(x, t, reduction="none"))


# ---------------------------------------------------------------- fuzz (vs the float64 reference)

EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25"))
TRITON_EXAMPLES = int(os.environ.get("TESSERA_FUZZ_TRITON_EXAMPLES", "8"))
LAYOUTS = ("contig", "rowslice", "transposed", "broadcast", "offset")


@st.composite
def _fuzz_case(draw, max_numel=24_000):
    lead = tuple(draw(st.lists(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, 9), min_size=0, max_size=3)))
    V = draw(st.sampled_from([1, 2, 3]) | st.integers(1, 300) | st.sampled_from([2047, 2048, 2049, 4099]))
    while lead and V * max(1, torch.Size(lead).numel()) > max_numel:
        lead = lead[1:]
    layout = draw(st.sampled_from(LAYOUTS)) if lead else "contig"
    opts = {"reduction": draw(st.sampled_from(["mean", "sum", "none"]))}
    if draw(st.booleans()):
        opts["label_smoothing"] = draw(st.sampled_from([0.05, 0.3, 1.0]))
    if draw(st.booleans()):
        opts["z_loss"] = draw(st.sampled_from([1e-4, 1e-2]))
    if draw(st.booleans()):
        opts["softcap"] = draw(st.sampled_from([1.0, 5.0, 30.0]))
    if draw(st.booleans()):
        opts["ignore_index"] = draw(st.sampled_from([0, V - 1, -1]))
    opts["return_lse"] = draw(st.booleans())
    case = ce_spec._case(f"fuzz-{lead}x{V}-{layout}-{opts}", lead, V, layout=layout,
                         scale=draw(st.sampled_from([0.1, 1.0, 8.0])), ignored=draw(st.sampled_from([0.0, 0.3, 1.0])),
                         int32=draw(st.booleans()), **opts)
    return draw(st.sampled_from(SPEC.dtypes)), case


_SETTINGS = dict(deadline=None, derandomize=os.environ.get("TESSERA_FUZZ_RANDOM") != "1", database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(drawn=_fuzz_case())
def test_fuzz_cross_entropy_cpu_vs_reference(drawn):
    dtype, case = drawn
    r = run_case(SPEC, "cpu", dtype, case, fp32_eager=True)
    assert r.ok, f"{case.name} {dtype}: {r.why}"


@pytest.mark.skipif(not triton_backend.interpreted(), reason="triton runs here only under TRITON_INTERPRET=1")
def test_fuzz_cross_entropy_triton_vs_reference():
    """The same fuzz on the Triton interpreter: its own small budget (TESSERA_FUZZ_TRITON_EXAMPLES),
    kept out of `-m fuzz` like tests/test_fuzz.py's Triton variant (@given is built in here)."""
    @settings(max_examples=TRITON_EXAMPLES, **_SETTINGS)
    @given(drawn=_fuzz_case(max_numel=4096))
    def check(drawn):
        dtype, case = drawn
        r = run_case(SPEC, "triton", dtype, case, fp32_eager=True)
        assert r.ok, f"{case.name} {dtype}: {r.why}"

    check()
