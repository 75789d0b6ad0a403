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
and without ``residual``/``weight``, an int8 or fp8 KV cache, an fp8 weight) plus
one non-contiguous layout case.

Every dtype an op supports is checked (``spec.dtypes``: fp32, fp16 and bf16, int8 and
int16 for ``int_mm``; the int8 / fp8 operands of the quantized ops are case variants):
a fake kernel, an ``out_dtypes`` entry or a backward whose output dtype is right only in
fp32 fails here.  The first dtype gets every picked case on every backend; the others one
case per combination of operand dtypes (fp16 q with an int8 / fp8 / fp16 cache, ...) on
the cpu and triton backends (the reference kernels are float64 math cast back, the same
code in every dtype), which keeps the file at ~1.5x its fp32-only time.

Every other backend (triton under the interpreter, opencl) gets one small case per dtype; a
forward-only kernel module (``BACKWARD = False``) is checked forward only, with inputs that do
not require gradients (its gradient raises BackendError: tests/test_errors.py).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tessera
from tessera._registry import has_backward, supports
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


def _signature(kw, dtypes_only: bool = False) -> tuple:
    """Which arguments are tensors (and their dtypes: an int8 / fp8 cache or weight is its own
    variant) / None, and the discrete (non-float) options: one case per variant.  With
    ``dtypes_only``, only the tensors' dtypes (the variants that matter in a second dtype)."""
    sig = []
    for k, v in sorted(kw.items()):
        if isinstance(v, torch.Tensor):
            sig.append((k, "T", str(v.dtype)))
        elif not dtypes_only and (v is None or isinstance(v, (str, bool, int))):
            sig.append((k, repr(v)))
    return tuple(sig)


def pick_cases(spec, max_numel: int = MAX_NUMEL, dtype=None, dtypes_only: bool = False):
    """Smallest case of every argument signature + the smallest non-contiguous layout case;
    with ``dtypes_only`` (the op's second and third dtypes), one case per combination of
    operand dtypes and no layout case (strides do not depend on the dtype)."""
    dtype = dtype or spec.dtypes[0]
    best: dict[tuple, tuple[int, object]] = {}
    layout = None
    for case in spec.cases:
        if case.tags & SKIP_TAGS or (dtypes_only and "layout" in case.tags):
            continue
        kw = case.make(dtype, torch.device("cpu"), torch.Generator().manual_seed(0))
        n = _numel(kw)
        biggest = max((v.numel() for v in kw.values() if isinstance(v, torch.Tensor)), default=0)
        if n > max_numel:
            continue
        if "layout" in case.tags:
            if layout is None or n < layout[0]:
                layout = (n, case)
            continue
        sig = _signature(kw, dtypes_only)
        # prefer cases with a few elements per tensor (1x1 hides indexing bugs), then the smallest
        key = (biggest < 8, n)
        if sig not in best or key < best[sig][0]:
            best[sig] = (key, case)
    out = [c for _, c in best.values()]
    if layout is not None:
        out.append(layout[1])
    return out


def _dname(dtype) -> str:
    return str(dtype).replace("torch.", "")


def record_calls(spec, case, backend, dtype=torch.float32):
    """Run one case forward (+ backward unless ``nograd``) and return the recorded tessera calls."""
    gen = torch.Generator().manual_seed(seed_for(f"opcheck/{spec.name}/{case.name}"))
    kw = case.make(dtype, torch.device("cpu"), gen)
    grads = "nograd" not in case.tags and has_backward(spec, backend)
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
            for i, dtype in enumerate(spec.dtypes):
                if i > 0 and backend == "reference":
                    continue  # its kernels are float64 math cast back: one dtype checks the wiring
                tag = "" if i == 0 else f"{_dname(dtype)}-"  # the first dtype keeps its old test ids
                for case in pick_cases(spec, dtype=dtype, dtypes_only=i > 0):
                    out.append(pytest.param(spec, backend, case, dtype, id=f"{name}-{backend}-{tag}{case.name}"))
    return out


def _check_all(spec, backend, case, dtype=torch.float32):
    ok, why = supports(spec, backend, torch.device("cpu"), dtype)
    if not ok:
        pytest.skip(why)
    calls = record_calls(spec, case, backend, dtype)
    assert calls, f"tessera.{spec.name} did not call any tessera:: custom op"
    assert any(p == "forward" for *_, p in calls)
    if "nograd" not in case.tags and spec.grad_inputs and has_backward(spec, backend):
        assert any(p == "backward" for *_, p in calls), \
            f"tessera.{spec.name}: backward did not go through a tessera:: custom op (not a fused kernel?)"
    seen = set()
    for func, args, kwargs, phase in calls:
        key = (str(func), phase)
        if key in seen:
            continue
        seen.add(key)
        prepared = _prepare(args, phase)
        utils = _OPCHECK_UTILS
        if any(t.dtype in _FP8 for t in _tensors(prepared)):
            # torch's schema test compares every argument before/after with float math that has no
            # fp8 CPU kernel ("mul_cpu_reduced_float"): check "no hidden mutation" on the raw bytes
            utils = tuple(u for u in utils if u != "test_schema")
            before = [t.detach().view(torch.uint8).clone() for t in _tensors(prepared) if t.dtype in _FP8]
            func(*prepared, **kwargs)
            after = [t.detach().view(torch.uint8) for t in _tensors(prepared) if t.dtype in _FP8]
            assert all(torch.equal(a, b) for a, b in zip(before, after)), f"{func} mutated an fp8 input"
        result = torch.library.opcheck(func, prepared, dict(kwargs), test_utils=utils)
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not bad, f"{func} ({phase}): {bad}"


_OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
_FP8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


_PARAMS = _params(("cpu", "reference"))


@pytest.mark.parametrize("spec,backend,case,dtype", _PARAMS)
def test_opcheck(spec, backend, case, dtype):
    _check_all(spec, backend, case, dtype)


def _one_small_case(spec, dtype):
    cases = pick_cases(spec, max_numel=1024, dtype=dtype)
    return cases[:1]


def _small_params():
    """One small case per dtype on every backend other than the two above (triton, run under the
    interpreter here; opencl): each skips where its backend cannot run (supports() says why)."""
    out = []
    for name, spec in sorted(tessera.OPS.items()):
        for backend in spec.kernels:
            if backend in ("cpu", "reference"):
                continue
            for i, dtype in enumerate(spec.dtypes):
                tag = "" if i == 0 else f"{_dname(dtype)}-"
                for case in _one_small_case(spec, dtype):
                    out.append(pytest.param(spec, backend, case, dtype, id=f"{name}-{backend}-{tag}{case.name}"))
    return out


_SMALL_PARAMS = _small_params()


@pytest.mark.parametrize("spec,backend,case,dtype", _SMALL_PARAMS)
def test_opcheck_small(spec, backend, case, dtype):
    _check_all(spec, backend, case, dtype)


def test_every_dtype_is_opchecked():
    """Each op x backend x supported dtype has at least one opcheck case (not only fp32)."""
    want = {(n, b, d) for n, s in tessera.OPS.items() for b in s.kernels if b != "reference" for d in s.dtypes}
    have = {(p.values[0].name, p.values[1], p.values[3]) for p in _PARAMS + _SMALL_PARAMS}
    missing = sorted((n, b, str(d)) for n, b, d in want - have)
    assert not missing, f"ops x backends x dtypes that opcheck never runs: {missing[:10]} ({len(missing)})"


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
