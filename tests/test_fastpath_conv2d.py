"""conv2d's C++ twin (``csrc/fastpath_conv2d.h``): it replays what the Python body did for a
call's signature (the vendor call, or the dense / depthwise kernel launch with its packing), so
it must equal that body bit for bit, be taken on the second call of a signature, count its
route like ``dispatch.use_vendor``, and hand back to Python whenever what the Python decision
read has changed: the weight (in-place update, another tensor), the dispatch mode or rule, the
backend request, or the test hooks."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import tessera
from tessera import _library, dispatch
from tessera.ops.conv2d import cpu as conv_cpu


def _rand(shape, dtype=torch.float32, seed=0, cl=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if cl else t


# (name, x, weight, bias, conv kwargs, activation): every route and packing the twin replays
def _cases(dtype):
    return [
        ("dense-3x3-pad-nchw", _rand((2, 5, 9, 11), dtype, 1), _rand((7, 5, 3, 3), dtype, 2),
         _rand((7,), dtype, 3), dict(padding=1), "relu"),
        ("dense-3x3-s2-d2-cl", _rand((1, 6, 13, 12), dtype, 4, cl=True), _rand((9, 6, 3, 3), dtype, 5), None,
         dict(stride=2, dilation=2, padding=(2, 1)), "silu"),
        ("pointwise-cl", _rand((1, 16, 7, 5), dtype, 6, cl=True), _rand((33, 16, 1, 1), dtype, 7),
         _rand((33,), dtype, 8), {}, "relu6"),
        ("pointwise-s2-odd", _rand((2, 6, 7, 9), dtype, 9, cl=True), _rand((5, 6, 1, 1), dtype, 10),
         _rand((5,), dtype, 11), dict(stride=2), None),
        ("groups3-gelu", _rand((1, 6, 7, 9), dtype, 12), _rand((12, 2, 3, 3), dtype, 13), None,
         dict(groups=3, padding=1), "gelu"),
        ("dw-cl-s2", _rand((1, 24, 13, 13), dtype, 14, cl=True), _rand((24, 1, 3, 3), dtype, 15),
         _rand((24,), dtype, 16), dict(groups=24, stride=2, padding=1), "relu6"),
        ("dw-nchw-k5", _rand((2, 17, 4, 13), dtype, 17), _rand((17, 1, 5, 5), dtype, 18), None,
         dict(groups=17, padding=2), "relu"),
        ("view-cl", _rand((1, 9, 6, 16), dtype, 19, cl=True)[:, 2:8, :, ::2], _rand((4, 6, 3, 3), dtype, 20),
         None, dict(padding=1), None),
    ]


def _python_forward(x, w, b, kw, act):
    """The Python body's forward for the same call (the specification the twin replays)."""
    s, pads, d = tessera.ops.conv2d.normalize(x.shape, w.shape, kw.get("stride", 1), kw.get("padding", 0),
                                             kw.get("dilation", 1))
    return conv_cpu.forward(x, w, b, s, pads, d, kw.get("groups", 1), act)


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), what
    assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num()), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["kernel", "vendor", "auto"])
def test_replay_is_taken_and_bit_identical(fast, dtype, mode, monkeypatch):
    monkeypatch.setenv("TESSERA_DISPATCH", mode)
    with torch.no_grad():
        for name, x, w, b, kw, act in _cases(dtype):
            counts = dict(dispatch.counts)
            first = tessera.conv2d(x, w, b, activation=act, **kw)   # the Python body, which teaches the twin
            route = _moved(counts)
            counts = dict(dispatch.counts)
            before = fast.calls()
            again = tessera.conv2d(x, w, b, activation=act, **kw)
            assert _moved(counts) == route, name                      # counted like the Python body
            # the vendor's silu / gelu epilogue (in fp32, rounded once) stays in Python
            python_only = route[1] == "vendor" and act in ("silu", "gelu")
            assert fast.calls() == before + (0 if python_only else 1), (name, route)
            _same(again, first, name)
            _same(again, _python_forward(x, w, b, kw, act), name)


def _moved(counts):
    """The one dispatch.counts key a call moved (by one)."""
    moved = {k: v - counts.get(k, 0) for k, v in dispatch.counts.items() if v != counts.get(k, 0)}
    assert len(moved) == 1 and list(moved.values()) == [1], moved
    return next(iter(moved))


def test_weight_updates_and_new_weights_are_seen(fast):
    x, b = _rand((1, 8, 9, 9), seed=1, cl=True), _rand((4,), seed=2)
    with torch.no_grad():
        for w in (_rand((4, 8, 1, 1), seed=3), _rand((8, 1, 3, 3), seed=4)):
            kw = dict(groups=8, padding=1) if w.shape[1] == 1 else {}
            bias = None if w.shape[1] == 1 else b
            tessera.conv2d(x, w, bias, **kw, backend="cpu")
            w.mul_(-2.0)                              # an optimizer step: the version counter moves
            _same(tessera.conv2d(x, w, bias, **kw), _python_forward(x, w, bias, kw, None), "in place")
            before = fast.calls()
            tessera.conv2d(x, w, bias, **kw)
            assert fast.calls() == before + 1          # relearned on the updated weight
            w2 = w.clone() + 1.0                       # another tensor of the same signature
            _same(tessera.conv2d(x, w2, bias, **kw), _python_forward(x, w2, bias, kw, None), "new weight")
            del w2
            gc.collect()                              # its packed copy dies with it: no stale read
            w3 = w.clone() - 1.0
            _same(tessera.conv2d(x, w3, bias, **kw), _python_forward(x, w3, bias, kw, None), "after gc")


def test_layers_of_one_signature_each_replay_their_own_weight(fast):
    """A network repeats a signature in many layers (MobileNetV2: 28 of its 52 convs): each layer
    is replayed with its own packed weight, none evicts another."""
    x = _rand((1, 16, 7, 7), seed=9, cl=True)
    layers = [(_rand((16, 16, 1, 1), seed=10 + i), {}) for i in range(3)] + \
             [(_rand((16, 1, 3, 3), seed=20 + i), dict(groups=16, padding=1)) for i in range(3)]
    with torch.no_grad():
        for w, kw in layers:
            tessera.conv2d(x, w, **kw)
        before = fast.calls()
        for _ in range(2):
            for w, kw in layers:
                _same(tessera.conv2d(x, w, **kw), _python_forward(x, w, None, kw, None), str(kw))
        assert fast.calls() == before + 2 * len(layers)


def test_rule_changes_and_backend_requests_reach_python(fast, monkeypatch):
    x, w = _rand((1, 16, 14, 14), seed=5, cl=True), _rand((64, 16, 1, 1), seed=6)   # (wider than NARROW_COUT)
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    # no NK floor (AMD's default CONV_NK_MIN keeps a 64 x 16 layer on the kernel whatever the rule)
    monkeypatch.setattr(dispatch, "CONV_NK_MIN", 0)
    monkeypatch.setattr(dispatch, "CONV_NK_MIN_BY_VENDOR", {})
    with torch.no_grad():
        for rule, route in (({"conv2d_1x1:float32": 16}, "vendor"), ({"conv2d_1x1:float32": None}, "kernel")):
            table = dict(dispatch.thresholds(), **rule)
            monkeypatch.setattr(dispatch, "thresholds", lambda t=table: t)
            for _ in range(3):
                before = dispatch.counts.get(("conv2d_1x1", route), 0)
                tessera.conv2d(x, w)
                assert dispatch.counts.get(("conv2d_1x1", route), 0) == before + 1, rule
        tessera.conv2d(x, w)
        before = fast.calls()
        ref = tessera.conv2d(x, w, backend="reference")
        with tessera.use_backend("reference"):
            tessera.conv2d(x, w)
        monkeypatch.setenv("TESSERA_BACKEND", "reference")
        tessera.conv2d(x, w)
        assert fast.calls() == before
        monkeypatch.delenv("TESSERA_BACKEND")
        torch.testing.assert_close(tessera.conv2d(x, w), ref.float(), rtol=1e-5, atol=1e-4)
        assert fast.calls() == before + 1


def test_hooks_errors_threads_and_autograd_bypass_or_follow(fast, monkeypatch):
    x, w = _rand((2, 4, 7, 7), seed=7), _rand((6, 4, 3, 3), seed=8)
    with torch.no_grad():
        y = tessera.conv2d(x, w, padding=1)
        before = fast.calls()
        with _library.poison_outputs():
            _same(tessera.conv2d(x, w, padding=1), y, "poisoned")
        with pytest.raises(ValueError, match="weight"):
            tessera.conv2d(x, w[:, :3], padding=1)     # another signature: the Python checks
        assert fast.calls() == before
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)                  # threads are chosen per call, not learned
            _same(tessera.conv2d(x, w, padding=1), y, "1 thread")
        finally:
            torch.set_num_threads(threads)
        assert fast.calls() == before + 1
    xg = x.clone().requires_grad_()
    tessera.conv2d(xg, w, padding=1, activation="relu").sum().backward()   # the custom op
    ref = x.clone().requires_grad_()
    F.relu(F.conv2d(ref, w, padding=1)).sum().backward()
    torch.testing.assert_close(xg.grad, ref.grad, rtol=1e-5, atol=1e-5)
    assert fast.calls() == before + 1
