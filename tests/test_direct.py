"""The eager shortcut (`_library.direct`): a no-grad eager call on plain tensors skips the
dispatcher and runs the custom op's own body; everything else must go through `tessera::`."""
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
