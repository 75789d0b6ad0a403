"""Backend selection: explicit argument > ``use_backend`` > ``TESSERA_BACKEND`` > device default.

Which backend ran is observed end to end: every backend's kernel module of the
op gets a spy ``forward`` that records its backend name and then runs the real
kernel.  Explicit requests that cannot run raise :class:`tessera.BackendError`
and never fall back; unknown names are rejected with a ValueError.
"""
from __future__ import annotations

import importlib
import threading
import warnings

import pytest
import torch

import tessera
from tessera import _library, _registry

SKIP_TAGS = {"large", "extreme", "empty", "layout"}
# the native backends that run here (cpu; opencl where a device is found; triton under the interpreter)
NATIVE = _registry.native_backends()


def _small_case(spec, dtype=None):
    for case in spec.cases:
        if not case.tags & SKIP_TAGS:
            return case.make(dtype or spec.dtypes[0], torch.device("cpu"), torch.Generator().manual_seed(0))
    raise AssertionError(f"{spec.name}: no small case")


@pytest.fixture
def clean_selection(monkeypatch):
    """No TESSERA_BACKEND from the caller's environment; a private selection memo; no C++ fast
    path (these tests spy on the Python launchers, which it does not call: tests/test_fastpath.py
    checks its own backend choice)."""
    monkeypatch.delenv("TESSERA_BACKEND", raising=False)
    monkeypatch.setattr(_registry, "_selected", {})
    monkeypatch.setattr(_library, "_FAST", {})
    return monkeypatch


@pytest.fixture(params=sorted(tessera.OPS))
def spied(request, clean_selection):
    """(spec, kwargs, calls): calls collects the backend name of every forward kernel run."""
    spec = tessera.OPS[request.param]
    calls: list[str] = []
    patched = set()
    for backend in [b for b in ("reference",) + NATIVE if b in spec.kernels]:
        mod = importlib.import_module(spec.kernels[backend])
        if mod in patched:   # the edge-CPU backends share one launcher module, bound per target
            continue
        patched.add(mod)
        orig = mod.forward

        def spy(*a, _orig=orig, _b=backend, **k):
            from tessera.backends import cross   # (the target a shared edge-CPU launcher runs for)
            calls.append(cross._target.get() or _b)
            return _orig(*a, **k)

        clean_selection.setattr(mod, "forward", spy)
    return spec, _small_case(spec), calls


def _ran(spied, **kw):
    spec, case_kw, calls = spied
    calls.clear()
    spec.fn(**case_kw, **kw)
    assert len(calls) == 1, calls
    return calls[0]


def test_device_default_is_cpu(spied):
    assert _ran(spied) == "cpu"


def test_every_native_backend_runs_when_asked(spied, monkeypatch):
    """Each native backend with a kernel for the op runs that kernel when asked for by argument,
    ``use_backend`` or TESSERA_BACKEND; automatic selection on CPU tensors stays ``cpu`` (opencl
    and the triton interpreter are never picked without being asked for)."""
    spec = spied[0]
    for b in [b for b in NATIVE if b in spec.kernels]:
        assert _ran(spied, backend=b) == b
        with tessera.use_backend(b):
            assert _ran(spied) == b
        monkeypatch.setenv("TESSERA_BACKEND", b)
        assert _ran(spied) == b
        monkeypatch.delenv("TESSERA_BACKEND")
        assert _ran(spied) == "cpu"


def test_env_overrides_default(spied, monkeypatch):
    monkeypatch.setenv("TESSERA_BACKEND", "reference")
    assert _ran(spied) == "reference"
    monkeypatch.delenv("TESSERA_BACKEND")
    assert _ran(spied) == "cpu"          # the memo must not pin the env's choice


def test_use_backend_overrides_env(spied, monkeypatch):
    monkeypatch.setenv("TESSERA_BACKEND", "reference")
    with tessera.use_backend("cpu"):
        assert _ran(spied) == "cpu"
    assert _ran(spied) == "reference"


def test_explicit_overrides_use_backend(spied, monkeypatch):
    monkeypatch.setenv("TESSERA_BACKEND", "cpu")
    with tessera.use_backend("reference"):
        assert _ran(spied) == "reference"
        assert _ran(spied, backend="cpu") == "cpu"
    with tessera.use_backend("cpu"):
        assert _ran(spied, backend="reference") == "reference"


def test_use_backend_nesting(spied):
    with tessera.use_backend("reference"):
        assert _ran(spied) == "reference"
        with tessera.use_backend("cpu"):
            assert _ran(spied) == "cpu"
            with tessera.use_backend(""):          # "" restores automatic selection
                assert _ran(spied) == "cpu"
        assert _ran(spied) == "reference"
    assert _ran(spied) == "cpu"


def test_use_backend_restored_after_exception(spied):
    with pytest.raises(KeyError):
        with tessera.use_backend("reference"):
            raise KeyError("boom")
    assert _ran(spied) == "cpu"


def test_use_backend_is_per_thread(spied):
    """The override is a context variable: another thread does not inherit it."""
    seen = []
    with tessera.use_backend("reference"):
        t = threading.Thread(target=lambda: seen.append(_ran(spied)))
        t.start()
        t.join()
        assert _ran(spied) == "reference"
    assert seen == ["cpu"]


def test_unknown_names_rejected(clean_selection):
    spec = next(iter(tessera.OPS.values()))
    kw = _small_case(spec)
    with pytest.raises(ValueError, match="nope"):
        with tessera.use_backend("nope"):
            pass
    with pytest.raises(ValueError, match="'backend'.*nope"):
        spec.fn(**kw, backend="nope")
    clean_selection.setenv("TESSERA_BACKEND", "nope")
    with pytest.raises(ValueError, match="TESSERA_BACKEND.*nope"):
        spec.fn(**kw)
    with pytest.raises(ValueError, match="TESSERA_BACKEND.*nope"):
        with tessera.use_backend(""):
            spec.fn(**kw)


def _with_kernel():
    return [pytest.param(n, b, id=f"{n}-{b}") for n in sorted(tessera.OPS) for b in NATIVE
            if b in tessera.OPS[n].kernels]


@pytest.mark.parametrize("name,backend", _with_kernel())
def test_explicit_unsupported_dtype_raises(name, backend, clean_selection):
    """A backend lacking a dtype: explicit requests raise; auto selection raises too (no fallback)."""
    spec = tessera.OPS[name]
    mod = importlib.import_module(spec.kernels[backend])
    # float ops lose bf16; integer ops (int_mm: int8, int16) lose their last dtype
    drop = torch.bfloat16 if torch.bfloat16 in spec.dtypes else spec.dtypes[-1]
    clean_selection.setattr(mod, "DTYPES", tuple(d for d in mod.DTYPES if d != drop))
    kw = _small_case(spec, drop)  # the case's own inputs in that dtype (scales etc. keep theirs)
    # (automatic selection on CPU tensors is the cpu backend's: it raises only when cpu lacks the dtype)
    for how in ({"backend": backend},) + (({},) if backend == "cpu" else ()):
        with pytest.raises(tessera.BackendError, match=str(drop).replace("torch.", "")):
            spec.fn(**kw, **how)
    with tessera.use_backend(backend), pytest.raises(tessera.BackendError, match=backend):
        spec.fn(**kw)
    spec.fn(**kw, backend="reference")       # an explicit reference request still works


@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("name", sorted(tessera.OPS))
def test_explicit_backend_without_kernel_raises(name, backend, clean_selection):
    """An explicit request for a backend that has no kernel for the op (an op no opencl kernel was
    written for yet; here every op, its entry removed): BackendError naming the backend, no fallback."""
    spec = tessera.OPS[name]
    clean_selection.setattr(spec, "kernels", {k: v for k, v in spec.kernels.items() if k != backend})
    with pytest.raises(tessera.BackendError, match=f"'{backend}'.*no kernel"):
        spec.fn(**_small_case(spec), backend=backend)
    with tessera.use_backend(backend), pytest.raises(tessera.BackendError, match="no kernel"):
        spec.fn(**_small_case(spec))


def test_no_compiler_falls_back_to_reference_with_warning(clean_selection):
    """Only a missing native toolchain makes automatic selection use the reference (and it warns)."""
    from tessera.backends import cpu
    clean_selection.setattr(cpu, "available", lambda: (False, "no C compiler found (test)"))
    clean_selection.setattr(_registry, "_warned_fallback", False)
    spec = next(iter(tessera.OPS.values()))
    kw = _small_case(spec)
    with pytest.warns(RuntimeWarning, match="reference"):
        spec.fn(**kw)
    with pytest.raises(tessera.BackendError, match="compiler"):
        spec.fn(**kw, backend="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # warned once per process, not on every call
        spec.fn(**kw)


def test_select_returns_kernel_modules(clean_selection):
    for name, spec in tessera.OPS.items():
        for b in [b for b in ("reference",) + NATIVE if b in spec.kernels]:
            mod = _registry.select(spec, torch.device("cpu"), spec.dtypes[0], b)
            assert mod.__name__ == spec.kernels[b]
            # inference-only ops (no grad_inputs) need no backward kernel
            for attr in ("DTYPES", "forward") + (("backward",) if spec.grad_inputs else ()):
                assert hasattr(mod, attr), f"{mod.__name__} lacks {attr}"


def test_supports_reports_reasons():
    spec = next(iter(tessera.OPS.values()))
    ok, why = _registry.supports(spec, "bogus", torch.device("cpu"), torch.float32)
    assert not ok and "bogus" in why
    ok, why = _registry.supports(spec, "cpu", torch.device("meta"), torch.float32)
    assert not ok and "meta" in why
    ok, why = _registry.supports(spec, "cpu", torch.device("cpu"), torch.float64)
    assert not ok and "float64" in why


def test_launch_env_reads_follow_every_change(monkeypatch):
    """``tessera._env.get`` (the launch path's cheap ``os.environ.get``) sees a variable set,
    changed and removed at run time through ``os.environ`` or monkeypatch, and its default."""
    import os
    from tessera import _env
    name = "TESSERA_ENV_PROBE_VAR"
    monkeypatch.delenv(name, raising=False)
    assert _env.get(name) == "" and _env.get(name, "d") == "d"
    monkeypatch.setenv(name, "a")
    assert _env.get(name) == "a"
    os.environ[name] = "b-\u00e9"
    assert _env.get(name) == os.environ.get(name) == "b-\u00e9"
    del os.environ[name]
    assert _env.get(name, "gone") == "gone"


def test_shaped_views_like_view():
    """``_library.shaped`` (view with unpacked sizes) gives what ``view(shape)`` gives, 0-d included."""
    from tessera._library import shaped
    t = torch.arange(6.0)
    for shape in [(2, 3), (6,), (1, 2, 3), torch.Size([3, 2])]:
        assert torch.equal(shaped(t, shape), t.view(shape)) and shaped(t, shape).data_ptr() == t.data_ptr()
    s = shaped(torch.tensor([5.0]), ())
    assert s.dim() == 0 and s.item() == 5.0
    u = torch.empty(2, 3)
    assert shaped(u, torch.Size([2, 3])) is u  # nothing to reshape: no new view


def test_rows_keeps_2d_row_views_and_reshapes_the_rest():
    """``_library.rows``: a 2-D tensor with unit inner stride (any row stride, broadcast rows
    included) is returned as is; other layouts give the (rows, n) view or a copy."""
    from tessera._library import rows
    base = torch.arange(24.0).view(4, 6)
    for t in (base, base[:, :3], base[::2], torch.arange(3.0).expand(5, 3)):
        assert rows(t) is t
    assert rows(base.t()).stride() == (4, 1) and torch.equal(rows(base.t()), base.t())
    assert rows(base.view(2, 2, 6)).shape == (4, 6) and rows(torch.arange(3.0)).shape == (1, 3)
