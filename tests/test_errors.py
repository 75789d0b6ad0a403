"""Bad inputs raise clear ValueError/TypeError naming the argument; the process never crashes.

The bad calls are generated from each op spec: take a small valid case, then
break one argument at a time (wrong dtype, wrong rank, wrong size, other
device, non-finite eps, bad option strings, ...).  Every message must name the
offending argument and say what it got (shape/dtype/device or value).  A few
op-specific checks follow at the end.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tessera
from tessera._registry import forward_only, has_backward, native_backends

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# bad input must get the same clear error whichever backend is asked for: the reference and every
# native backend that runs here (cpu; opencl where a device is found; triton under the interpreter)
CHECKED_BACKENDS = ("reference",) + native_backends()

SKIP_TAGS = {"large", "extreme", "empty", "layout"}


def _base_case(spec):
    """Smallest untagged case with the most tensor arguments (so every argument gets broken)."""
    best = None
    for case in spec.cases:
        if case.tags & SKIP_TAGS:
            continue
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        t = [v for v in kw.values() if isinstance(v, torch.Tensor)]
        if not t or max(v.numel() for v in t) < 8:
            continue
        key = (-len(t), sum(v.numel() for v in t))
        if best is None or key < best[0]:
            best = (key, kw)
    assert best is not None, f"{spec.name}: no small case to build bad inputs from"
    return best[1]


def _order(spec, kw):
    """Tensor argument names in the public function's parameter order (the first is the primary)."""
    params = list(inspect.signature(spec.fn).parameters)
    names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]
    return sorted(names, key=lambda k: params.index(k) if k in params else len(params))


def _bad_calls(spec):
    """Yield (id, kwargs, exception types, substrings the message must contain)."""
    kw = _base_case(spec)
    names = _order(spec, kw)
    first = names[0]
    for k in names:
        t = kw[k]
        if t.is_floating_point():
            yield f"{k}-int32", {**kw, k: t.to(torch.int32)}, TypeError, [f"'{k}'", "int32"]
            yield f"{k}-float64", {**kw, k: t.to(torch.float64)}, TypeError, [f"'{k}'", "float64"]
        else:  # indices / lengths: either integer width may be legal, a float never is
            yield f"{k}-float32", {**kw, k: t.to(torch.float32)}, TypeError, [f"'{k}'", "float32"]
        # (fp8 tensors have no comparison kernels on the CPU: compare their float value)
        yield f"{k}-bool", {**kw, k: (t.float() if t.dtype in FP8 else t) > 0}, TypeError, [f"'{k}'", "bool"]
        # alone, a 0-d input may be legal (elementwise ops): see test_zero_dim_alone; a spec's
        # ``scalar_ok`` arguments (per-tensor quantization scales) are legal as 0-d
        if len(names) > 1 and k not in spec.scalar_ok:
            yield f"{k}-0d", {**kw, k: t.reshape(-1)[0].clone()}, ValueError, [f"'{k}'", "()"]
        if k != first and t.is_floating_point():  # a wider index table (e.g. block_table) is legal
            bigger = torch.randn(*t.shape[:-1], t.shape[-1] + 1).to(t.dtype)
            yield f"{k}-lastdim+1", {**kw, k: bigger}, ValueError, [f"'{k}'", str(tuple(bigger.shape))]
            yield f"{k}-meta", {**kw, k: t.to("meta")}, ValueError, [f"'{k}'", "meta"]
            if t.shape == kw[first].shape:
                # tensors shaped like the primary input are activations: same dtype, same leading dims
                other = torch.float16 if t.dtype != torch.float16 else torch.bfloat16
                yield f"{k}-dtype-mismatch", {**kw, k: t.to(other)}, TypeError, [f"'{k}'", str(other)]
                taller = torch.randn(t.shape[0] + 1, *t.shape[1:]).to(t.dtype)
                yield f"{k}-rows+1", {**kw, k: taller}, ValueError, [f"'{k}'", str(tuple(taller.shape))]
    for k, v in kw.items():
        if k == "eps":
            for bad in (float("nan"), float("inf"), -float("inf"), -1e-3):
                yield f"eps={bad}", {**kw, k: bad}, ValueError, ["'eps'", str(bad)]
        elif isinstance(v, str):
            yield f"{k}-bogus", {**kw, k: "bogus"}, ValueError, [f"'{k}'", "bogus"]
        elif isinstance(v, int) and not isinstance(v, bool) and k == "dim":
            nd = kw[first].dim()
            yield f"{k}-out-of-range", {**kw, k: nd + 2}, (ValueError, IndexError), [f"'{k}'", str(nd + 2)]
    yield "backend-unknown", {**kw, "backend": "cuda-magic"}, ValueError, ["'backend'", "cuda-magic"]


def _wrong_python_types(spec):
    """Arguments of the wrong Python type: these reach torch's schema parser unless the public
    function validates first, and it raises RuntimeError there (not the TypeError of the contract)."""
    kw = _base_case(spec)
    for k in _order(spec, kw):
        yield f"{k}-list", {**kw, k: kw[k].tolist()}, TypeError, [f"'{k}'", "list"]
    if "eps" in kw:
        yield "eps-str", {**kw, "eps": "1e-5"}, TypeError, ["'eps'", "str"]
        yield "eps-bool", {**kw, "eps": True}, TypeError, ["'eps'", "bool"]
    yield "backend-int", {**kw, "backend": 3}, TypeError, ["'backend'", "int"]


def _backends(spec):
    """The backends checked for ``spec``: those of CHECKED_BACKENDS that have a kernel for it."""
    return [b for b in CHECKED_BACKENDS if b in spec.kernels]


def _params(gen=_bad_calls):
    out = []
    for name, spec in sorted(tessera.OPS.items()):
        for bid, bkw, exc, needles in gen(spec):
            for backend in _backends(spec):
                out.append(pytest.param(spec, bkw, exc, needles, backend, id=f"{name}-{bid}-{backend}"))
    return out


@pytest.mark.parametrize("spec,kw,exc,needles,backend", _params())
def test_bad_input(spec, kw, exc, needles, backend):
    _expect(spec, kw, exc, needles, backend)


@pytest.mark.parametrize("name", sorted(tessera.OPS))
def test_wrong_python_type(name):
    """One test per op, listing every argument whose wrong Python type is not a clear TypeError."""
    spec = tessera.OPS[name]
    bad = []
    for bid, kw, exc, needles in _wrong_python_types(spec):
        try:
            _expect(spec, kw, exc, needles, "cpu")
        except (Exception, pytest.fail.Exception) as e:  # collect, report all at once
            bad.append(f"{bid}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    assert not bad, f"tessera.{name}: wrong argument types must raise TypeError naming the argument " \
                    f"(validate before calling the custom op):\n" + "\n".join(bad)


def _expect(spec, kw, exc, needles, backend):
    kw = dict(kw)
    kw.setdefault("backend", backend)
    with pytest.raises(exc) as info:
        spec.fn(**kw)
    msg = str(info.value)
    assert f"tessera.{spec.name}" in msg or spec.name in msg, f"message does not name the op: {msg}"
    for needle in needles:
        assert needle in msg, f"message {msg!r} does not contain {needle!r}"


def _single_tensor_ops():
    return [n for n, spec in sorted(tessera.OPS.items())
            if sum(isinstance(v, torch.Tensor) for v in _base_case(spec).values()) == 1]


@pytest.mark.parametrize("name,backend", [(n, b) for n in _single_tensor_ops() for b in _backends(tessera.OPS[n])])
def test_zero_dim_alone(name, backend):
    """A 0-d input is either rejected (ValueError naming it, with its shape) or computed correctly."""
    from tessera._registry import Case
    from tessera.testing.matrix import run_case
    spec = tessera.OPS[name]
    kw = _base_case(spec)
    k = _order(spec, kw)[0]
    try:
        spec.fn(**{**kw, k: kw[k].reshape(-1)[0].clone()}, backend=backend)
    except ValueError as e:
        assert f"'{k}'" in str(e) and "()" in str(e), str(e)
        return
    for dtype in spec.dtypes:
        def make(dt, device, gen, _kw=kw):
            return {**_kw, k: torch.randn((), generator=gen, dtype=torch.float64).to(dt).to(device)}
        r = run_case(spec, backend, dtype, Case("0d", make))
        assert r.ok, f"0-d input accepted but wrong ({dtype}): {r.why}"


@pytest.mark.parametrize("name", sorted(tessera.OPS))
def test_env_backend_unknown(name, monkeypatch):
    spec = tessera.OPS[name]
    monkeypatch.setenv("TESSERA_BACKEND", "nope")
    with pytest.raises(ValueError, match="TESSERA_BACKEND.*nope"):
        spec.fn(**_base_case(spec))


def test_use_backend_unknown():
    with pytest.raises(ValueError, match="nope"):
        with tessera.use_backend("nope"):
            pass


@pytest.mark.parametrize("name,backend", [(n, b) for n in sorted(tessera.OPS) for b in _backends(tessera.OPS[n])
                                          if b != "reference"])
def test_meta_device_backend_error(name, backend):
    """An explicit native backend on non-CPU real tensors (the cpu and opencl backends run on CPU
    tensors; triton here on CPU tensors under the interpreter) is impossible: BackendError, never a
    fallback."""
    spec = tessera.OPS[name]
    kw = _base_case(spec)
    dt = spec.dtypes[0]  # float32 for float ops, int8 for integer ones (int_mm)
    ok, _ = tessera._registry.supports(spec, backend, torch.device("cpu"), dt)
    assert ok
    with pytest.raises(tessera.BackendError, match=backend):
        tessera._registry.select(spec, torch.device("meta"), dt, backend)
    spec.fn(**kw, backend=backend)  # and the same inputs on CPU are fine


# ---------------------------------------------------------------- forward-only kernel modules

def _forward_only_params():
    """Every (op, backend) whose kernel module declares BACKWARD = False (no backward kernel there),
    plus one planted: rms_norm's cpu module made forward-only, so the check below always runs."""
    out = [pytest.param(n, b, False, id=f"{n}-{b}") for n, spec in sorted(tessera.OPS.items()) if spec.grad_inputs
           for b in _backends(spec) if not has_backward(spec, b)]
    return out + [pytest.param("rms_norm", "cpu", True, id="planted-rms_norm-cpu")]


def _grad_case(spec):
    """A small float32 case with leaves for every gradient input, and its kwargs."""
    kw = dict(_base_case(spec))
    for k in spec.grad_inputs:
        if isinstance(kw.get(k), torch.Tensor) and kw[k].is_floating_point():
            kw[k] = kw[k].detach().clone().requires_grad_(True)
    return kw


@pytest.mark.parametrize("name,backend,planted", _forward_only_params())
def test_forward_only_backend_raises_on_gradient(name, backend, planted, monkeypatch):
    """A forward-only kernel module (BACKWARD = False, ``backward = forward_only(op, backend)``):
    the forward runs (the matrix checks it), and a gradient request raises BackendError naming the
    op and the backend, instead of returning anything."""
    spec = tessera.OPS[name]
    if planted:
        mod = tessera._registry.kernel_module(spec, backend)
        monkeypatch.setattr(mod, "BACKWARD", False, raising=False)
        monkeypatch.setattr(mod, "backward", forward_only(name, backend))
        assert not has_backward(spec, backend)
    kw = _grad_case(spec)
    with torch.no_grad():
        spec.fn(**kw, backend=backend)                  # forward alone is fine
    out = spec.fn(**kw, backend=backend)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad]
    assert outs, f"{name}: no differentiable output"
    with pytest.raises(tessera.BackendError) as info:
        torch.autograd.grad([o.float().sum() for o in outs], [v for v in kw.values()
                                                             if isinstance(v, torch.Tensor) and v.requires_grad])
    msg = str(info.value)
    assert name in msg and repr(backend) in msg and "forward" in msg, msg


_TRITON_SCRIPT = textwrap.dedent("""
    import os, sys
    assert "TRITON_INTERPRET" not in os.environ
    import torch, tessera
    from tessera.testing.cases import seed_for
    failures = []
    for name, spec in sorted(tessera.OPS.items()):
        if "triton" not in spec.kernels:
            continue
        case = next(c for c in spec.cases if not c.tags)
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        try:
            spec.fn(**kw, backend="triton")
            failures.append(f"{name}: no error")
        except tessera.BackendError as e:
            msg = str(e)
            if "triton" not in msg or "TRITON_INTERPRET" not in msg or name not in msg:
                failures.append(f"{name}: unclear message {msg!r}")
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
    print("\\n".join(failures))
    sys.exit(1 if failures else 0)
""")


def test_triton_on_cpu_without_interpreter_subprocess():
    """backend='triton' on CPU tensors without TRITON_INTERPRET: BackendError, no crash, no fallback."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


# ---------------------------------------------------------------- op-specific

def _rms_norm_extra():
    x, w = torch.randn(4, 8), torch.randn(8)
    return [
        ("empty-lastdim", dict(x=torch.randn(4, 0), weight=None), ValueError, ["'x'", "(4, 0)"]),
        ("weight-2d", dict(x=x, weight=w.reshape(2, 4)), ValueError, ["'weight'", "(2, 4)"]),
    ]


def _layer_norm_extra():
    x, w = torch.randn(4, 8), torch.randn(8)
    return [
        ("bias-wrong-size", dict(x=x, weight=w, bias=torch.randn(7)), ValueError, ["'bias'", "(7,)"]),
        ("bias-float64", dict(x=x, weight=w, bias=torch.randn(8, dtype=torch.float64)), TypeError,
         ["'bias'", "float64"]),
    ]


_EXTRA = {"rms_norm": _rms_norm_extra, "layer_norm": _layer_norm_extra}


def _extra_params():
    out = []
    for name, make in sorted(_EXTRA.items()):
        if name in tessera.OPS:
            for bid, kw, exc, needles in make():
                out.append(pytest.param(name, kw, exc, needles, id=f"{name}-{bid}"))
    return out


@pytest.mark.parametrize("name,kw,exc,needles", _extra_params())
def test_op_specific(name, kw, exc, needles):
    with pytest.raises(exc) as info:
        tessera.OPS[name].fn(**kw, backend="cpu")
    for needle in needles:
        assert needle in str(info.value), f"{info.value} does not contain {needle!r}"
