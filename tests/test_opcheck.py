"""``torch.library.opcheck`` on every ``tessera::`` custom op, generated from the op specs.

The custom ops are found generically: each case is run once (forward and
backward) under a ``TorchDispatchMode`` that records every ``tessera::`` call
with its real arguments.  Ops seen during the forward are checked with their
autograd-requiring inputs (so ``test_autograd_registration`` and the
AOT-autograd test exercise the registered backward); ops seen during the
backward are checked with detached inputs (backward kernels are not
differentiable themselves: double backward is not supported).

opcheck runs the schema test (no hidden mutation/aliasing), the fake-tensor test
(fake kernel agrees with the real one on shapes/dtypes/strides) and the
AOT-dispatch test (compiled forward/backward match eager).  Cases are picked
generically: the smallest case of every distinct argument signature (e.g. with
and without ``residual``/``weight``) plus one non-contiguous layout case.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tessera
from tessera._registry import backend_available, supports
from tessera.backends import triton as triton_backend
from tessera.testing.cases import seed_for
from tessera.testing.matrix import _inputs

SKIP_TAGS = {"large", "extreme", "empty"}
MAX_NUMEL = 4096


class _Recorder(TorchDispatchMode):
    """Records every ``tessera::`` op call (overload, args, kwargs, phase)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "tessera":
            self.calls.append((func, args, kwargs, self.phase))
        return func(*args, **kwargs)


def _numel(kw) -> int:
    return sum(v.numel() for v in kw.values() if isinstance(v, torch.Tensor))


def _signature(kw) -> tuple:
    """Which arguments are tensors / None, and the discrete (non-float) options: one case per variant."""
    sig = []
    for k, v in sorted(kw.items()):
        if isinstance(v, torch.Tensor):
            sig.append((k, "T"))
        elif v is None or isinstance(v, (str, bool, int)):
            sig.append((k, repr(v)))
    return tuple(sig)


def pick_cases(spec, max_numel: int = MAX_NUMEL):
    """Smallest case of every argument signature + the smallest non-contiguous layout case."""
    best: dict[tuple, tuple[int, object]] = {}
    layout = None
    for case in spec.cases:
        if case.tags & SKIP_TAGS:
            continue
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        n = _numel(kw)
        biggest = max((v.numel() for v in kw.values() if isinstance(v, torch.Tensor)), default=0)
        if n > max_numel:
            continue
        if "layout" in case.tags:
            if layout is None or n < layout[0]:
                layout = (n, case)
            continue
        sig = _signature(kw)
        # prefer cases with a few elements per tensor (1x1 hides indexing bugs), then the smallest
        key = (biggest < 8, n)
        if sig not in best or key < best[sig][0]:
            best[sig] = (key, case)
    out = [c for _, c in best.values()]
    if layout is not None:
        out.append(layout[1])
    return out


def record_calls(spec, case, backend, dtype=torch.float32):
    """Run one case forward (+ backward unless ``nograd``) and return the recorded tessera calls."""
    gen = torch.Generator().manual_seed(seed_for(f"opcheck/{spec.name}/{case.name}"))
    kw = case.make(dtype, torch.device("cpu"), gen)
    grads = "nograd" not in case.tags
    k_kw, leaves = _inputs(kw, spec.grad_inputs if grads else ())
    rec = _Recorder()
    with rec:
        out = spec.fn(**k_kw, backend=backend)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad]
        if leaves and outs:
            rec.phase = "backward"
            ups = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
            torch.autograd.backward(outs, ups)
    return rec.calls


def _prepare(args, phase):
    """Fresh leaves that keep each argument's layout (views stay views: strides are part of the test)."""
    def conv(a):
        if isinstance(a, torch.Tensor):
            d = a.detach()
            if phase == "forward" and a.requires_grad:
                d.requires_grad_(True)
            return d
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a
    return [conv(a) for a in args]


def _params(backends):
    out = []
    for name, spec in sorted(tessera.OPS.items()):
        for backend in backends:
            if backend not in spec.kernels:
                continue
            for case in pick_cases(spec):
                out.append(pytest.param(spec, backend, case, id=f"{name}-{backend}-{case.name}"))
    return out


def _check_all(spec, backend, case, dtype=torch.float32):
    ok, why = supports(spec, backend, torch.device("cpu"), dtype)
    if not ok:
        pytest.skip(why)
    calls = record_calls(spec, case, backend, dtype)
    assert calls, f"tessera.{spec.name} did not call any tessera:: custom op"
    assert any(p == "forward" for *_, p in calls)
    if "nograd" not in case.tags and spec.grad_inputs:
        assert any(p == "backward" for *_, p in calls), \
            f"tessera.{spec.name}: backward did not go through a tessera:: custom op (not a fused kernel?)"
    seen = set()
    for func, args, kwargs, phase in calls:
        key = (str(func), phase)
        if key in seen:
            continue
        seen.add(key)
        result = torch.library.opcheck(func, _prepare(args, phase), dict(kwargs))
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not bad, f"{func} ({phase}): {bad}"


@pytest.mark.parametrize("spec,backend,case", _params(("cpu", "reference")))
def test_opcheck(spec, backend, case):
    _check_all(spec, backend, case, spec.dtypes[0])  # float32, or int8 for integer ops


def _one_small_case(spec):
    cases = pick_cases(spec, max_numel=1024)
    return cases[:1]


def _triton_params():
    out = []
    for name, spec in sorted(tessera.OPS.items()):
        if "triton" in spec.kernels:
            for case in _one_small_case(spec):
                out.append(pytest.param(spec, case, id=f"{name}-triton-{case.name}"))
    return out


@pytest.mark.skipif(not (triton_backend.interpreted() and backend_available("triton", torch.device("cpu"))[0]),
                    reason="triton backend needs TRITON_INTERPRET=1 on a CPU-only machine")
@pytest.mark.parametrize("spec,case", _triton_params())
def test_opcheck_triton_interpreted(spec, case):
    _check_all(spec, "triton", case, spec.dtypes[0])


@pytest.mark.parametrize("name", sorted(tessera.OPS))
def test_custom_ops_registered(name):
    """Every spec has a forward and a backward ``tessera::`` op (the fused-backward contract)."""
    ns = torch.ops.tessera
    assert hasattr(ns, name), f"torch.ops.tessera.{name} is not registered"
    spec = tessera.OPS[name]
    if spec.grad_inputs:
        assert hasattr(ns, f"{name}_backward"), f"torch.ops.tessera.{name}_backward is not registered"


# ---------------------------------------------------------------- the harness can fail

@torch.library.custom_op("tessera_selftest::bad_fake", mutates_args=())
def _bad_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_bad_fake.register_fake
def _(x):
    return x.new_empty(x.shape[:-1])  # wrong shape on purpose


def test_opcheck_catches_a_wrong_fake_kernel():
    """A fake kernel that disagrees with the real one must fail opcheck (guards the test above)."""
    x = torch.randn(3, 4)
    with pytest.raises(Exception, match="(?i)shape|size|fake"):
        torch.library.opcheck(_bad_fake, (x,))
