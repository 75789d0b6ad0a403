"""conv2d_int8's C++ twin (``csrc/fastpath_conv2d_int8.h``): it replays the launches the Python
body made for a call's signature (the GEMM with or without im2col, the two depthwise kernels, the
layout copies), so it must be taken on the second call of a signature, equal the Python body and
the reference bit for bit (strides included), read the multiplier / shift of every call, and
hand back to Python whenever what the Python path derived has changed: the weight or the bias
(in place, or another tensor), the shift values (the range check), the backend request or the
test hooks."""
from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

import tessera
from tessera import _library
from tessera.ops.conv2d_int8 import _ref

GOLDEN = json.loads((Path(__file__).parent / "golden" / "requant" / "vectors.json").read_text())


def _ints(shape, dtype, seed, lo=None, hi=None):
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape, generator=g,
                         dtype=torch.int64).to(dtype)


def _layer(x_dtype, O, Cg, k, seed, per_channel=True, bias=True):
    """(weight, bias, multiplier, shift) of a plausible layer: shifts that keep outputs in range"""
    acc = torch.int32 if x_dtype == torch.int8 else torch.int64
    n = O if per_channel else 1
    return (_ints((O, Cg, k, k), torch.int8, seed), _ints((O,), acc, seed + 1, -5000, 5000) if bias else None,
            _ints((n,), torch.int32, seed + 2, 1 << 29, (1 << 31) - 1), _ints((n,), torch.int32, seed + 3, -14, -9))


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


# (name, x, x_zp, layer, conv kwargs): every route and layout the twin replays
def _cases():
    i8, i16 = torch.int8, torch.int16
    return [
        ("pointwise-cl-rows", _cl(_ints((1, 16, 7, 5), i8, 1)), 3, _layer(i8, 24, 16, 1, 2), {}),
        ("pointwise-nchw-transposed", _ints((2, 16, 5, 3), i8, 3), -7, _layer(i8, 9, 16, 1, 4), {}),
        ("pointwise-s2-subsampled", _cl(_ints((1, 8, 9, 7), i8, 5)), 0, _layer(i8, 12, 8, 1, 6, bias=False),
         dict(stride=2)),
        ("dense-3x3-im2col-cl", _cl(_ints((1, 6, 9, 11), i8, 7)), 5, _layer(i8, 7, 6, 3, 8),
         dict(padding=1, stride=(2, 1))),
        ("dense-3x3-nchw-d2", _ints((1, 5, 11, 10), i8, 9), -2, _layer(i8, 4, 5, 3, 10, per_channel=False),
         dict(padding=2, dilation=2)),
        ("stem-c1-order0", _ints((2, 1, 8, 8), i8, 11), 1, _layer(i8, 6, 1, 3, 12), dict(padding=1)),
        ("groups3", _cl(_ints((1, 6, 7, 9), i8, 13)), 4, _layer(i8, 12, 2, 3, 14), dict(groups=3, padding=1)),
        ("dw-k3-s2-cl", _cl(_ints((1, 24, 13, 13), i8, 15)), -9, _layer(i8, 24, 1, 3, 16),
         dict(groups=24, stride=2, padding=1)),
        ("dw-k3-nchw", _ints((1, 17, 6, 9), i8, 17), 2, _layer(i8, 17, 1, 3, 18), dict(groups=17, padding=1)),
        ("dw-k5-taps", _cl(_ints((2, 8, 9, 9), i8, 19)), 6, _layer(i8, 8, 1, 5, 20), dict(groups=8, padding=2)),
        ("s16-dense", _cl(_ints((1, 6, 7, 7), i16, 21)), 0, _layer(i16, 5, 6, 3, 22), dict(padding=1)),
        ("s16-nchw-copy", _ints((1, 6, 5, 5), i16, 23), 0, _layer(i16, 8, 6, 1, 24), {}),
        ("s16-dw", _cl(_ints((1, 8, 7, 7), i16, 25)), 0, _layer(i16, 8, 1, 3, 26), dict(groups=8, padding=1)),
        ("view-cl", _cl(_ints((1, 12, 9, 16), i8, 27))[:, 2:8, :, ::2], 1, _layer(i8, 4, 6, 3, 28), dict(padding=1)),
    ]


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), what
    assert torch.equal(a, b), what


def _call(x, zp, layer, kw, **extra):
    w, b, m, s = layer
    return tessera.conv2d_int8(x, zp, w, b, m, s, -3 if x.dtype == torch.int8 else 0, **kw, **extra)


def _reference(x, zp, layer, kw, **extra):
    w, b, m, s = layer
    return _ref(x, zp, w, b, m, s, -3 if x.dtype == torch.int8 else 0, **kw, **extra)


@pytest.mark.parametrize("rounding", [None, "single"])   # None: the default, "double" for int8 x
def test_replay_is_taken_and_bit_identical(fast, rounding):
    for name, x, zp, layer, kw in _cases():
        first = _call(x, zp, layer, kw, rounding=rounding)        # the Python body, which teaches the twin
        before = fast.calls()
        again = _call(x, zp, layer, kw, rounding=rounding)
        assert fast.calls() == before + 1, name
        _same(again, first, name)
        ref = _reference(x, zp, layer, kw, rounding=rounding)
        assert torch.equal(again, ref), name
        # the output's layout is x's (channels-last x -> channels-last output, else NCHW)
        cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        assert again.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format), name


def test_golden_vectors_replayed(fast):
    """The independent golden vectors (tests/golden/gen_requant.py) on the replayed call too."""
    for i, v in enumerate(GOLDEN["conv2d"]):
        xdt = getattr(torch, v["x_dtype"])
        x = torch.tensor(v["x"], dtype=torch.int64).to(xdt)
        args = (v["x_zero_point"], torch.tensor(v["weight"], dtype=torch.int8),
                torch.tensor(v["bias"], dtype=torch.int32 if xdt == torch.int8 else torch.int64),
                torch.tensor(v["multiplier"], dtype=torch.int32), torch.tensor(v["shift"], dtype=torch.int32),
                v["out_zero_point"], v["stride"], v["padding"], v["dilation"], v["groups"], v["qmin"], v["qmax"])
        want = torch.tensor(v["out"], dtype=torch.int64)
        for fmt in (torch.contiguous_format, torch.channels_last):
            xf = x.contiguous(memory_format=fmt)
            tessera.conv2d_int8(xf, *args)
            before = fast.calls()
            y = tessera.conv2d_int8(xf, *args)
            assert fast.calls() == before + 1 and torch.equal(y.long(), want), f"vector {i} {fmt}"


def test_weight_bias_and_scales_changes_are_seen(fast):
    x = _cl(_ints((1, 8, 9, 9), torch.int8, 1))
    for w, b, m, s in (_layer(torch.int8, 6, 8, 1, 2), _layer(torch.int8, 8, 1, 3, 3)):
        kw = dict(groups=8, padding=1) if w.shape[1] == 1 else {}
        layer = (w, b, m, s)
        _call(x, 2, layer, kw)
        w.neg_()                                      # an update in place: the version counter moves
        assert torch.equal(_call(x, 2, layer, kw), _reference(x, 2, layer, kw)), "weight in place"
        b.add_(977)                                   # the bias: the offset derived from it
        assert torch.equal(_call(x, 2, layer, kw), _reference(x, 2, layer, kw)), "bias in place"
        m.sub_(1 << 27)                               # multiplier / shift are read on every call
        s.add_(1)
        before = fast.calls()
        assert torch.equal(_call(x, 2, layer, kw), _reference(x, 2, layer, kw)), "scales in place"
        assert fast.calls() == before + 1
        assert torch.equal(_call(x, 5, layer, kw), _reference(x, 5, layer, kw)), "another x_zp"
        for other in ((w.clone().add_(1), b, m, s), (w, b.clone().sub_(3), m, s)):   # other tensors
            assert torch.equal(_call(x, 2, other, kw), _reference(x, 2, other, kw)), "new tensor"
        w2 = w.clone()
        _call(x, 2, (w2, b, m, s), kw)
        del w2
        gc.collect()                                  # its derived copies die with it: no stale read
        w3 = w.clone().sub_(1)
        assert torch.equal(_call(x, 2, (w3, b, m, s), kw), _reference(x, 2, (w3, b, m, s), kw)), "after gc"


def test_shift_range_is_checked_on_every_call(fast):
    x = _cl(_ints((1, 8, 5, 5), torch.int8, 4))
    w, b, m, s = _layer(torch.int8, 4, 8, 1, 5)
    _call(x, 0, (w, b, m, s), {})
    _call(x, 0, (w, b, m, s), {})
    s[1] = 31                                         # outside [-31, 30]: the Python check rejects it
    before = fast.calls()
    with pytest.raises(ValueError, match="shift"):
        _call(x, 0, (w, b, m, s), {})
    assert fast.calls() == before


def test_layers_of_one_signature_each_replay_their_own_weight(fast):
    x = _cl(_ints((1, 16, 7, 7), torch.int8, 6))
    layers = [(_layer(torch.int8, 16, 16, 1, 10 + i), {}) for i in range(3)] + \
             [(_layer(torch.int8, 16, 1, 3, 20 + i), dict(groups=16, padding=1)) for i in range(3)]
    for layer, kw in layers:
        _call(x, 1, layer, kw)
    before = fast.calls()
    for _ in range(2):
        for layer, kw in layers:
            assert torch.equal(_call(x, 1, layer, kw), _reference(x, 1, layer, kw)), str(kw)
    assert fast.calls() == before + 2 * len(layers)


def test_backend_requests_hooks_and_inference_weights_reach_python(fast, monkeypatch):
    x = _cl(_ints((1, 8, 6, 6), torch.int8, 7))
    layer = _layer(torch.int8, 5, 8, 3, 8)
    kw = dict(padding=1)
    y = _call(x, 3, layer, kw)
    before = fast.calls()
    _same(_call(x, 3, layer, kw, backend="reference"), _reference(x, 3, layer, kw).contiguous(
        memory_format=torch.channels_last), "reference")
    with tessera.use_backend("reference"):
        _call(x, 3, layer, kw)
    monkeypatch.setenv("TESSERA_BACKEND", "reference")
    _call(x, 3, layer, kw)
    monkeypatch.delenv("TESSERA_BACKEND")
    with _library.poison_outputs():
        _same(_call(x, 3, layer, kw), y, "poisoned")
    with pytest.raises(ValueError, match="weight"):
        _call(x, 3, (layer[0][:, :4], *layer[1:]), kw)   # another signature: the Python checks
    assert fast.calls() == before
    _same(_call(x, 3, layer, kw), y, "replayed")
    assert fast.calls() == before + 1
    with torch.inference_mode():                        # inference tensors have no version to stamp
        layer_i = tuple(t.clone() for t in layer)
        xi = x.clone(memory_format=torch.channels_last)
        for _ in range(2):
            _same(_call(xi, 3, layer_i, kw), y, "inference mode")
    assert fast.calls() == before + 1
