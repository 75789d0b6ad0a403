"""linear_int8_requant's C++ twin (``csrc/fastpath_linear_int8.h``): it replays the one GEMM launch
the Python body made for a call's signature, so it must be taken on the second call of a
signature, equal the Python body and the reference bit for bit (leading dims, GEMV and GEMM
sizes, int16 activations), read the multiplier / shift of every call, and hand back to Python
whenever what the Python path derived has changed (the weight or the bias, in place or another
tensor; the shift range; another x_zp), for layouts it does not cover, for backend requests and
under the test hooks."""
from __future__ import annotations

import gc

import pytest
import torch

import tessera
from tessera import _library
from tessera.ops.linear_int8_requant import _ref

# the golden vectors and the seeded random codes of conv2d_int8's twin tests (a sibling module)
from test_fastpath_conv2d_int8 import GOLDEN, _ints


def _layer(x_dtype, N, K, seed, per_channel=True, bias=True):
    """(weight, bias, multiplier, shift) with shifts that keep most outputs inside the range"""
    acc = torch.int32 if x_dtype == torch.int8 else torch.int64
    n = N if per_channel else 1
    lo, hi = (-14, -9) if x_dtype == torch.int8 else (-22, -16)
    return (_ints((N, K), torch.int8, seed), _ints((N,), acc, seed + 1, -5000, 5000) if bias else None,
            _ints((n,), torch.int32, seed + 2, 1 << 29, (1 << 31) - 1), _ints((n,), torch.int32, seed + 3, lo, hi))


# (name, x, x_zp, layer, kwargs): the GEMV (M <= 16) and the GEMM (M > 16, packed panels)
def _cases():
    i8, i16 = torch.int8, torch.int16
    return [
        ("gemv-m1", _ints((1, 96), i8, 1), 3, _layer(i8, 40, 96, 2), {}),
        ("gemv-m7-3d", _ints((7, 1, 33), i8, 3), -9, _layer(i8, 17, 33, 4, per_channel=False), {}),
        ("gemm-m123", _ints((123, 70), i8, 5), 0, _layer(i8, 65, 70, 6, bias=False), {}),
        ("gemm-2x9x64-relu", _ints((2, 9, 64), i8, 7), 11, _layer(i8, 130, 64, 8), dict(qmin=-4)),
        ("int16-output", _ints((20, 40), i8, 9), -1, _layer(i8, 9, 40, 10), dict(qmin=-1000, qmax=1000)),
        ("single-rounding", _ints((5, 24), i8, 11), 7, _layer(i8, 16, 24, 12), dict(rounding="single")),
        ("s16-gemv", _ints((3, 50), i16, 13), 0, _layer(i16, 12, 50, 14), {}),
        ("s16-gemm", _ints((33, 20), i16, 15), 0, _layer(i16, 8, 20, 16, per_channel=False), {}),
    ]


def _call(x, zp, layer, **kw):
    w, b, m, s = layer
    return tessera.linear_int8_requant(x, zp, w, b, m, s, -3 if x.dtype == torch.int8 else 0, **kw)


def _reference(x, zp, layer, **kw):
    w, b, m, s = layer
    return _ref(x, zp, w, b, m, s, -3 if x.dtype == torch.int8 else 0, **kw)


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), what
    assert torch.equal(a, b), what


def test_replay_is_taken_and_bit_identical(fast):
    for name, x, zp, layer, kw in _cases():
        first = _call(x, zp, layer, **kw)                 # the Python body, which teaches the twin
        before = fast.calls()
        again = _call(x, zp, layer, **kw)
        assert fast.calls() == before + 1, name
        _same(again, first, name)
        _same(again, _reference(x, zp, layer, **kw), name)
        # twice the rows, the same side of M = 16 (every case): the same entry replays (M is not in the key)
        more = torch.cat([x, x.flip(0)])
        before = fast.calls()
        _same(_call(more, zp, layer, **kw), _reference(more, zp, layer, **kw), name + " other M")
        assert fast.calls() == before + 1, name


def test_golden_vectors_replayed(fast):
    """The independent golden vectors (tests/golden/gen_requant.py) on the replayed call too."""
    for i, v in enumerate(GOLDEN["linear"]):
        xdt = getattr(torch, v.get("x_dtype", "int8"))
        x = torch.tensor(v["x"], dtype=torch.int64).to(xdt)
        acc = torch.int32 if xdt == torch.int8 else torch.int64
        bias = None if v["bias"] is None else torch.tensor(v["bias"], dtype=acc)
        args = (v["x_zero_point"], torch.tensor(v["weight"], dtype=torch.int8), bias,
                torch.tensor(v["multiplier"], dtype=torch.int32), torch.tensor(v["shift"], dtype=torch.int32),
                v["out_zero_point"], v["qmin"], v["qmax"])
        want = torch.tensor(v["out"], dtype=torch.int64)
        tessera.linear_int8_requant(x, *args)
        before = fast.calls()
        y = tessera.linear_int8_requant(x, *args)
        assert fast.calls() == before + 1 and torch.equal(y.long(), want), f"vector {i}"


def test_weight_bias_and_scales_changes_are_seen(fast):
    for M in (1, 40):   # the GEMV (offset only) and the GEMM (offset and packed panels)
        x = _ints((M, 48), torch.int8, M)
        w, b, m, s = layer = _layer(torch.int8, 24, 48, 2)
        _call(x, 2, layer)
        w.neg_()                                      # an update in place: the version counter moves
        _same(_call(x, 2, layer), _reference(x, 2, layer), f"M={M} weight in place")
        b.add_(977)                                   # the bias: the offset derived from it
        _same(_call(x, 2, layer), _reference(x, 2, layer), f"M={M} bias in place")
        m.sub_(1 << 27)                               # multiplier / shift are read on every call
        s.add_(1)
        before = fast.calls()
        _same(_call(x, 2, layer), _reference(x, 2, layer), f"M={M} scales in place")
        assert fast.calls() == before + 1
        _same(_call(x, 5, layer), _reference(x, 5, layer), f"M={M} another x_zp")
        for other in ((w.clone().add_(1), b, m, s), (w, b.clone().sub_(3), m, s)):   # other tensors
            _same(_call(x, 2, other), _reference(x, 2, other), f"M={M} new tensor")
        w2 = w.clone()
        _call(x, 2, (w2, b, m, s))
        del w2
        gc.collect()                                  # its derived tensors die with it: no stale read
        w3 = w.clone().sub_(1)
        _same(_call(x, 2, (w3, b, m, s)), _reference(x, 2, (w3, b, m, s)), f"M={M} after gc")


def test_shift_range_is_checked_on_every_call(fast):
    x = _ints((3, 16), torch.int8, 4)
    w, b, m, s = _layer(torch.int8, 8, 16, 5)
    _call(x, 0, (w, b, m, s))
    _call(x, 0, (w, b, m, s))
    s[1] = 31                                         # outside [-31, 30]: the Python check rejects it
    before = fast.calls()
    with pytest.raises(ValueError, match="shift"):
        _call(x, 0, (w, b, m, s))
    assert fast.calls() == before


def test_layers_of_one_signature_each_replay_their_own_weight(fast):
    x = _ints((1, 32), torch.int8, 6)
    layers = [_layer(torch.int8, 16, 32, 10 + i) for i in range(4)]
    for layer in layers:
        _call(x, 1, layer)
    before = fast.calls()
    for _ in range(2):
        for layer in layers:
            _same(_call(x, 1, layer), _reference(x, 1, layer), "layer")
    assert fast.calls() == before + 2 * len(layers)


def test_uncovered_layouts_backends_hooks_and_inference_weights_reach_python(fast, monkeypatch):
    x = _ints((4, 40), torch.int8, 7)
    layer = _layer(torch.int8, 12, 40, 8)
    y = _call(x, 3, layer)
    before = fast.calls()
    xt = _ints((40, 4), torch.int8, 7).t()            # a non-contiguous x: the Python body copies it
    _same(_call(xt, 3, layer), _reference(xt, 3, layer), "transposed x")
    _same(_call(x[:0], 3, layer), _reference(x[:0], 3, layer), "empty x")
    _same(_call(x, 3, layer, backend="reference"), y, "reference")
    with tessera.use_backend("reference"):
        _call(x, 3, layer)
    monkeypatch.setenv("TESSERA_BACKEND", "reference")
    _call(x, 3, layer)
    monkeypatch.delenv("TESSERA_BACKEND")
    with _library.poison_outputs():
        _same(_call(x, 3, layer), y, "poisoned")
    with pytest.raises(ValueError, match="weight"):
        _call(x, 3, (layer[0][:, :20], *layer[1:]))   # another signature: the Python checks
    with pytest.raises(ValueError, match="x_zero_point"):
        _call(x, 300, layer)
    assert fast.calls() == before
    _same(_call(x, 3, layer), y, "replayed")
    assert fast.calls() == before + 1
    with torch.inference_mode():                      # inference tensors have no version to stamp
        layer_i = tuple(t.clone() for t in layer)
        for _ in range(2):
            _same(_call(x.clone(), 3, layer_i), y, "inference mode")
    assert fast.calls() == before + 1
