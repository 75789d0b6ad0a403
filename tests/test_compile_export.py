"""torch.compile (fullgraph) and torch.export of every op, forward and backward.

The custom ops are opaque to the compilers, so compiled results must equal eager
tessera results (same kernels run); any graph break makes ``fullgraph=True``
raise.  One small case per op keeps this file fast on 2 cores: inductor
compiles of a forward + backward graph take several seconds each.
"""
from __future__ import annotations

import io

import pytest
import torch

import tessera
from tessera.testing.cases import seed_for

SKIP_TAGS = {"large", "extreme", "empty", "nograd", "layout"}


def _tensors(kw):
    return {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}


def _richest_small_case(spec, max_numel=2048):
    """The small case exercising the most tensor arguments (e.g. weight + residual)."""
    best = None
    for case in spec.cases:
        if case.tags & SKIP_TAGS:
            continue
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        t = _tensors(kw)
        n = sum(v.numel() for v in t.values())
        if n > max_numel or max(v.numel() for v in t.values()) < 8:
            continue
        key = (-len(t), n)
        if best is None or key < best[0]:
            best = (key, case)
    return None if best is None else best[1]


def _cases_of_other_shape(spec, case):
    """Another case with the same tensor arguments but different shapes (for dynamic shapes)."""
    kw0 = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    for other in spec.cases:
        if other is case or other.tags & SKIP_TAGS:
            continue
        kw = other.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        if set(_tensors(kw)) != set(_tensors(kw0)) or sum(v.numel() for v in _tensors(kw).values()) > 8192:
            continue
        same_nontensor = {k: v for k, v in kw.items() if not isinstance(v, (torch.Tensor, float))} == \
            {k: v for k, v in kw0.items() if not isinstance(v, (torch.Tensor, float))}
        if same_nontensor and any(kw[k].shape != kw0[k].shape for k in _tensors(kw)):
            return other
    return None


def _make(spec, case, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed_for(f"compile/{spec.name}/{case.name}"))
    return case.make(dtype, torch.device("cpu"), gen)


def _run(fn, spec, kw, gen_seed=0):
    """Forward + backward with leaves for the grad inputs; returns (outputs, grads)."""
    kw = {k: (v.detach().clone().requires_grad_(k in spec.grad_inputs and v.is_floating_point())
              if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    out = fn(**kw)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    leaves = [kw[k] for k in spec.grad_inputs if isinstance(kw.get(k), torch.Tensor)]
    g = torch.Generator().manual_seed(gen_seed)
    ups = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, leaves, ups, allow_unused=True) if leaves else ()
    return [o.detach() for o in outs], list(grads)


def _assert_same(a, b, what):
    (oa, ga), (ob, gb) = a, b
    assert len(oa) == len(ob), what
    for i, (x, y) in enumerate(zip(oa, ob)):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=lambda m: f"{what} output {i}: {m}")
    for i, (x, y) in enumerate(zip(ga, gb)):
        assert (x is None) == (y is None), f"{what}: grad {i} presence differs"
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=lambda m: f"{what} grad {i}: {m}")


def _params():
    out = []
    for name, spec in sorted(tessera.OPS.items()):
        case = _richest_small_case(spec)
        if case is not None:
            out.append(pytest.param(spec, case, id=f"{name}-{case.name}"))
    return out


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.parametrize("spec,case", _params())
def test_compile_fullgraph(spec, case, compiler):
    torch._dynamo.reset()
    kw = _make(spec, case)

    def f(**kw):
        return spec.fn(**kw, backend="cpu")

    eager = _run(f, spec, kw)
    compiled = _run(torch.compile(f, fullgraph=True, backend=compiler), spec, kw)
    _assert_same(compiled, eager, f"{spec.name} torch.compile({compiler})")


@pytest.mark.parametrize("spec,case", _params())
def test_compile_dynamic_shapes(spec, case):
    """Fake kernels must work with symbolic shapes: one dynamic graph serves two shapes."""
    other = _cases_of_other_shape(spec, case)
    if other is None:
        pytest.skip("no second case with the same arguments and another shape")
    torch._dynamo.reset()

    def f(**kw):
        return spec.fn(**kw, backend="cpu")

    cf = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for c in (case, other):
        kw = _make(spec, c)
        _assert_same(_run(cf, spec, kw), _run(f, spec, kw), f"{spec.name}/{c.name} dynamic")


class _Wrap(torch.nn.Module):
    """A module calling the op: tensors are forward() arguments, everything else is fixed."""

    def __init__(self, spec, names, consts):
        super().__init__()
        self.spec, self.names, self.consts = spec, names, consts

    def forward(self, *tensors):
        return self.spec.fn(**dict(zip(self.names, tensors)), **self.consts, backend="cpu")


@pytest.mark.parametrize("spec,case", _params())
def test_export(spec, case):
    kw = _make(spec, case)
    names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]
    consts = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
    mod = _Wrap(spec, names, consts)
    args = tuple(kw[k] for k in names)
    ep = torch.export.export(mod, args)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert any(getattr(t, "namespace", None) == "tessera" for t in targets), \
        f"exported graph of {spec.name} does not call a tessera:: op: {targets}"
    want = mod(*args)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    # the program runs as exported, and after a save/load round trip (the op is found by name)
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    for prog in (ep, torch.export.load(buf)):
        got = prog.module()(*args)
        got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
