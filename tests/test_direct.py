"""The eager shortcut (`_library.direct`): a no-grad eager call on plain tensors skips the
dispatcher and runs the custom op's own body; everything else must go through `tessera::`.

Every test runs twice: with the Python decision and with its C++ twin (`_fastpath`'s gate,
which `direct` calls once the extension has loaded)."""
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tessera
from tessera import _library


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True, params=["python", "c++"])
def decision(request, monkeypatch):
    from tessera import _fastpath
    loaded = _fastpath.module() is not None  # (loaded first: it sets the gate)
    if request.param == "python":
        monkeypatch.setattr(_library, "_GATE", [None])
    else:
        if not loaded:
            pytest.skip(f"no C++ fast path here: {_fastpath.status()}")
        assert _library._GATE[0] is not None
    return request.param


def _call(x, w):
    return tessera.rms_norm(x, w, backend="cpu")


def test_shortcut_matches_dispatched_bit_for_bit(monkeypatch):
    x, w = torch.randn(5, 37), torch.randn(37)
    with torch.no_grad():
        fast = _call(x, w)
        monkeypatch.setattr(_library, "_ALWAYS_DISPATCH", [True])
        slow = _call(x, w)
    assert torch.equal(fast, slow)


def test_shortcut_taken_only_for_plain_no_grad_calls():
    x, w = torch.randn(2, 8), torch.randn(8)
    op, impl = object(), object()
    with torch.no_grad():
        assert _library.direct(op, impl, x, w, None) is impl
    assert _library.direct(op, impl, x.requires_grad_(), w) is op            # autograd needs the op
    with torch.no_grad():
        assert _library.direct(op, impl, x, w) is impl                      # no grad: fine again
        assert _library.direct(op, impl, torch.empty(2, 8, device="meta")) is op
        with _Seen():
            assert _library.direct(op, impl, x) is op                       # dispatch modes see the op
        with torch.device("cpu"):                                           # a function mode
            assert _library.direct(op, impl, x) is op
        p = torch.nn.Parameter(torch.randn(8))
        assert _library.direct(op, impl, x, p) is impl                      # a model's weights: plain
        class Sub(torch.Tensor):
            pass
        assert _library.direct(op, impl, x, torch.randn(8).as_subclass(Sub)) is op  # another subclass
        assert _library.direct(op, impl, 3.0) is op                         # not a tensor: the op says so
        seen = torch.func.vmap(lambda t: torch.zeros(()) if _library.direct(op, impl, t) is op else torch.ones(()))(x)
        assert seen.sum() == 0                                              # functorch-wrapped: the op
    assert _library.direct(op, impl, x.detach(), torch.nn.Parameter(torch.randn(8))) is op  # grad needed


def test_shortcut_follows_the_library_flags(monkeypatch):
    x = torch.randn(2, 8)
    op, impl, twin = object(), object(), object()
    with torch.no_grad():
        monkeypatch.setitem(_library._FAST, impl, twin)
        assert _library.direct(op, impl, x) is twin                         # the C++ body where one exists
        with _library.poison_outputs():
            assert _library.direct(op, impl, x) is impl                     # outputs poisoned: Python's
        env = os.environ
        monkeypatch.setattr(os, "environ", dict(env))
        assert _library.direct(op, impl, x) is impl                         # a stand-in environment
        monkeypatch.setattr(os, "environ", env)
        monkeypatch.setattr(_library, "_ALWAYS_DISPATCH", [True])
        assert _library.direct(op, impl, x) is op


@pytest.mark.parametrize("grad", [False, True])
def test_modes_and_profilers_see_the_custom_op(grad):
    x = torch.randn(3, 16, requires_grad=grad)
    w = torch.randn(16)
    with _Seen() as seen:
        _call(x, w)
    assert any("tessera.rms_norm" in o or "tessera::rms_norm" in o for o in seen.ops), seen.ops
    with torch.profiler.profile() as prof:
        _call(x, w)
    assert any("tessera::rms_norm" in e.name for e in prof.events())
