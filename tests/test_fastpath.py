"""The per-call overhead work (issue #16 item 4): the C++ fast path (``tessera/_fastpath.py``,
``csrc/fastpath.cpp``) and the ffi launch glue (``tessera/_fastcall.py``, ``csrc/fastcall.c``).

The fast path runs the undecorated body of silu/gelu/swiglu/geglu/softmax/layer_norm/rms_norm
and int_mm in C++ for contiguous CPU inputs on the cpu backend.  It must give bit-identical results to the Python
body it stands in for, be taken where it claims to be (a counter in the extension), and hand
every other case (layouts, backend requests, ISAs, bad arguments, autograd, test hooks) to
the Python path unchanged.
"""
from __future__ import annotations

import ctypes
import os

import pytest
import torch

import tessera
from tessera import _env, _fastcall, _library
from tessera.ops import layer_norm as LN, rms_norm as RMS, silu as SILU, softmax as SM

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype)


# (public call, the same call through the Python body with the fast path off)
def _cases(dtype):
    out = []
    for i, shape in enumerate([(1,), (7,), (1, 1), (3, 123), (2, 5, 1025), (4, 7)]):
        n = shape[-1]
        x = _rand(shape, dtype, i)
        w, b, r = _rand((n,), dtype, 100 + i), _rand((n,), dtype, 200 + i), _rand(shape, dtype, 300 + i)
        w32 = w.float()
        wp, bp = torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())  # a model's weights
        out += [(f"silu{shape}", lambda x=x: tessera.silu(x)),
                (f"layer_norm-parameters{shape}", lambda x=x, w=wp, b=bp: tessera.layer_norm(x, w, b, 1e-5)),
                (f"rms_norm-parameter{shape}", lambda x=x, w=wp: tessera.rms_norm(x, w, 1e-6)),
                (f"softmax{shape}", lambda x=x: tessera.softmax(x, -1)),
                (f"softmax-lastdim{shape}", lambda x=x: tessera.softmax(x, x.dim() - 1)),
                (f"layer_norm{shape}", lambda x=x, w=w, b=b: tessera.layer_norm(x, w, b, 1e-5)),
                (f"layer_norm-nobias{shape}", lambda x=x, w=w32: tessera.layer_norm(x, w, None, 1e-3)),
                (f"layer_norm-noparams{shape}", lambda x=x: tessera.layer_norm(x, None, None)),
                (f"layer_norm-res{shape}", lambda x=x, w=w, b=b, r=r: tessera.layer_norm(x, w, b, residual=r)),
                (f"rms_norm{shape}", lambda x=x, w=w: tessera.rms_norm(x, w, 1e-6)),
                (f"rms_norm-fp32w{shape}", lambda x=x, w=w32: tessera.rms_norm(x, w, 0)),
                (f"rms_norm-now{shape}", lambda x=x: tessera.rms_norm(x, None)),
                (f"rms_norm-res{shape}", lambda x=x, w=w, r=r: tessera.rms_norm(x, w, 1e-6, residual=r)),
                (f"gelu{shape}", lambda x=x: tessera.gelu(x)),
                (f"gelu-tanh{shape}", lambda x=x: tessera.gelu(x, "tanh")),
                (f"swiglu{shape}", lambda x=x, r=r: tessera.swiglu(x, r)),
                (f"geglu{shape}", lambda x=x, r=r: tessera.geglu(x, r)),
                (f"geglu-tanh{shape}", lambda x=x, r=r: tessera.geglu(x, r, "tanh"))]
        if len(shape) == 2:  # int_mm (2-D only; its own dtypes, whatever the float dtype under test)
            g = torch.Generator().manual_seed(i)
            a8 = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
            a16 = torch.randint(-32768, 32768, shape, generator=g, dtype=torch.int16)
            b8 = torch.randint(-128, 128, (5, n), generator=g, dtype=torch.int8)
            out += [(f"int_mm-int8{shape}", lambda a=a8, b=b8: tessera.int_mm(a, b)),
                    (f"int_mm-int16{shape}", lambda a=a16, b=b8: tessera.int_mm(a, b))]
    return out


def _flat(out):
    return out if isinstance(out, tuple) else (out,)


def _same(a, b):
    a, b = _flat(a), _flat(b)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.shape == v.shape and u.dtype == v.dtype and u.is_contiguous()
        assert torch.equal(u, v) or torch.equal(u.isnan(), v.isnan()) and torch.equal(u[~u.isnan()], v[~v.isnan()])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_fast_path_is_taken_and_bit_identical(fast, dtype, monkeypatch):
    """Every case runs in C++ (the counter moves by one per call) and equals the Python body
    bit for bit (same kernel entry point, same arguments), outputs and shapes included."""
    cases = _cases(dtype)
    with torch.no_grad():
        for _, call in cases:  # an op's first launch goes through Python, which declares its kernel
            call()
        fast_out = {}
        for name, call in cases:
            before = fast.calls()
            fast_out[name] = call()
            assert fast.calls() == before + 1, f"{name}: the C++ fast path was not taken"
        monkeypatch.setattr(_library, "_FAST", {})
        for name, call in cases:
            before = fast.calls()
            _same(fast_out[name], call())
            assert fast.calls() == before, name


def _not_fast(fast, call):
    before = fast.calls()
    out = call()
    assert fast.calls() == before, "the C++ fast path ran where it must hand over to Python"
    return out


def test_other_layouts_and_dims_take_the_python_path(fast):
    x = _rand((6, 40), torch.float32, 1)
    with torch.no_grad():
        for call, ref in [
            (lambda: tessera.silu(x.t()), lambda: torch.nn.functional.silu(x.t())),
            (lambda: tessera.silu(x[:, ::2]), lambda: torch.nn.functional.silu(x[:, ::2])),
            (lambda: tessera.softmax(x, 0), lambda: torch.softmax(x, 0)),
            (lambda: tessera.softmax(x[:, :7], -1), lambda: torch.softmax(x[:, :7], -1)),
            (lambda: tessera.silu(x.new_empty(0, 3)), lambda: x.new_empty(0, 3)),
            (lambda: tessera.silu(x[0, 0]), lambda: torch.nn.functional.silu(x[0, 0])),  # 0-d
            (lambda: tessera.swiglu(*x.chunk(2, -1)), lambda: torch.nn.functional.silu(x[:, :20]) * x[:, 20:]),
            (lambda: tessera.geglu(x, x.t().contiguous().t()),
             lambda: torch.nn.functional.gelu(x) * x),                                   # up: column-major
            (lambda: tessera.gelu(x.t(), "tanh"), lambda: torch.nn.functional.gelu(x.t(), approximate="tanh")),
        ]:
            torch.testing.assert_close(_not_fast(fast, call), ref(), rtol=1e-5, atol=1e-5)  # gelu: erf to ~2e-6
        a = torch.randint(-128, 128, (40, 6), dtype=torch.int8)
        b = torch.randint(-128, 128, (3, 6), dtype=torch.int8)
        assert torch.equal(_not_fast(fast, lambda: tessera.int_mm(a.t().contiguous().t(), b)),
                           a.long().mm(b.long().t()).int())                               # a: column-major
        with pytest.raises(ValueError, match="approximate"):
            _not_fast(fast, lambda: tessera.gelu(x, "fast"))                              # the body's message


def test_parameters_of_any_layout_are_copied_like_python(fast, monkeypatch):
    """A strided or half-precision weight is handed to the kernel as a contiguous fp32 copy
    (what _library.as_fp32_param makes): fast, and bit-identical to the Python body."""
    x = _rand((6, 40), torch.bfloat16, 6)
    w = _rand((80,), torch.float16, 7)[::2]
    calls = [lambda: tessera.layer_norm(x, w, None), lambda: tessera.rms_norm(x, w, 1e-6)]
    with torch.no_grad():
        for call in calls:
            call()
        before = fast.calls()
        outs = [call() for call in calls]
        assert fast.calls() == before + 2
        monkeypatch.setattr(_library, "_FAST", {})
        for out, call in zip(outs, calls):
            _same(out, call())


def test_backend_requests_are_honoured(fast, monkeypatch):
    """backend=, use_backend() and TESSERA_BACKEND other than cpu go the Python way (to the backend
    asked for); "cpu" asked for by name is the fast path's own backend."""
    x = _rand((3, 33), torch.float32, 2)
    with torch.no_grad():
        _not_fast(fast, lambda: tessera.silu(x, backend="reference"))
        with tessera.use_backend("reference"):
            _not_fast(fast, lambda: tessera.softmax(x))
        monkeypatch.setenv("TESSERA_BACKEND", "reference")
        _not_fast(fast, lambda: tessera.rms_norm(x, None))
        monkeypatch.setenv("TESSERA_BACKEND", "cpu")
        before = fast.calls()
        tessera.rms_norm(x, None)
        tessera.silu(x, backend="cpu")
        with tessera.use_backend("cpu"):
            tessera.layer_norm(x, None, None)
        assert fast.calls() == before + 3
        monkeypatch.delenv("TESSERA_BACKEND")


def test_isa_choice_is_honoured(fast, monkeypatch):
    """With TESSERA_CPU_ISA naming a level, the kernel of that level's library runs: the first
    call goes through Python (which builds and declares it), the next ones are fast again."""
    x = _rand((3, 33), torch.float32, 3)
    from tessera.backends import cpu
    with torch.no_grad():
        ref = tessera.silu(x)
        for level in cpu.supported_isas():
            monkeypatch.setenv("TESSERA_CPU_ISA", level)
            tessera.silu(x)  # builds/declares that level's library
            before = fast.calls()
            torch.testing.assert_close(tessera.silu(x), ref, rtol=1e-6, atol=1e-7)
            assert fast.calls() == before + 1, level
        monkeypatch.setenv("TESSERA_CPU_ISA", "not-an-isa")
        with pytest.raises(ValueError, match="TESSERA_CPU_ISA"):
            _not_fast(fast, lambda: tessera.silu(x))


def test_bad_arguments_get_the_python_errors(fast):
    x = _rand((3, 8), torch.float32, 4)
    with torch.no_grad():
        for call, err, what in [
            (lambda: tessera.rms_norm(x, None, eps=-1.0), ValueError, "eps"),
            (lambda: tessera.rms_norm(x, None, eps=float("nan")), ValueError, "eps"),
            (lambda: tessera.layer_norm(x, torch.ones(7), None), ValueError, "weight"),
            (lambda: tessera.layer_norm(x, None, None, residual=x[:2]), ValueError, "residual"),
            (lambda: tessera.rms_norm(x, None, residual=x.half()), TypeError, "residual"),
            (lambda: tessera.rms_norm(x, torch.ones(8, dtype=torch.float64)), TypeError, "weight"),
            (lambda: tessera.softmax(x, 2), ValueError, "dim"),
            (lambda: tessera.silu(x.double()), TypeError, "x"),
        ]:
            with pytest.raises(err, match=what):
                _not_fast(fast, call)


def test_autograd_and_test_hooks_bypass_it(fast):
    """Inputs that require grad go through the custom op (and get gradients); poisoned or fenced
    outputs are the Python launchers' job."""
    x = _rand((4, 9), torch.float32, 5).requires_grad_()
    y = _not_fast(fast, lambda: tessera.silu(x))
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.func.grad(lambda t: torch.nn.functional.silu(t).sum())(x.detach()))
    # a Parameter weight with grad enabled: the custom op, and the weight gets its gradient
    w = torch.nn.Parameter(_rand((9,), torch.float32, 6))
    _not_fast(fast, lambda: tessera.rms_norm(x.detach(), w)).sum().backward()
    assert w.grad is not None and w.grad.shape == (9,)
    with torch.no_grad(), _library.poison_outputs():
        _not_fast(fast, lambda: tessera.softmax(x))
    with torch.no_grad(), torch.autograd.profiler.profile():
        _not_fast(fast, lambda: tessera.rms_norm(x, None))


def test_env_reads_follow_os_environ(fast, monkeypatch):
    """After the fastcall extension is loaded, _env reads the C environment: still every change
    made through os.environ at once."""
    assert _fastcall.module() is not None and _env._C_GETENV
    name = "TESSERA_FASTPATH_PROBE"
    monkeypatch.delenv(name, raising=False)
    assert _env.get(name, "d") == "d"
    os.environ[name] = "x\u00e9"
    assert _env.get(name) == "x\u00e9"
    del os.environ[name]
    assert _env.get(name) == ""


def test_fastcall_converts_like_ctypes(fast):
    """The ffi wrapper passes each argument kind exactly, and hands what it does not convert
    (a ctypes object, an int too big for the C type) to ctypes, which accepts or rejects it."""
    libc = ctypes.CDLL(None)
    labs = libc.labs
    labs.argtypes, labs.restype = [ctypes.c_int64], ctypes.c_int
    f = _fastcall.wrap(labs, "l")
    assert f is not labs and f(-5) == 5 and f(True) == 1
    with pytest.raises(ctypes.ArgumentError):
        f("5")
    ffs = libc.abs
    ffs.argtypes, ffs.restype = [ctypes.c_int], ctypes.c_int
    g = _fastcall.wrap(ffs, "i")
    assert g(-7) == 7 and g(2**40 + 3) == ffs(2**40 + 3)  # ctypes' own truncation
    assert g(ctypes.c_int(-9)) == 9
