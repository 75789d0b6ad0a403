"""tessera.nn modules against their torch.nn equivalents.

Each tessera module is loaded with the torch module's ``state_dict`` (random
parameters, strict), then outputs and the gradients of inputs and parameters are
compared with the torch module run in float64 (reference) under the project's
tolerance rule, with the torch module in the same dtype as the low-precision
baseline.  Modules must route through the ``tessera::`` ops.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tessera
import tessera.nn as tnn
from tessera.testing import tolerance

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class _OpSpy(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tessera":
            self.ops.add(func._opname)
        return func(*args, **(kwargs or {}))


def _rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _randomize(module, seed=1):
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(_rand(p.shape, p.dtype, seed + i) * 0.5 + 1.0)
    return module


def check(ours, theirs, inputs, dtype, op, *, call=None):
    """Compare ``ours(*inputs)`` with ``theirs``: outputs, input grads and parameter grads."""
    call = call or (lambda m, *a: m(*a))
    theirs = theirs.to(dtype)
    ours = ours.to(dtype)
    ref = copy.deepcopy(theirs).double()

    def run(m, xs):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        with _OpSpy() as spy:
            y = call(m, *xs)
        ys = y if isinstance(y, tuple) else (y,)
        g = torch.Generator().manual_seed(7)
        ups = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype) for t in ys]
        params = [p for p in m.parameters()]
        grads = torch.autograd.grad(ys, xs + params, ups)
        return ys, grads, spy.ops

    xs = [x.to(dtype) for x in inputs]
    y_o, g_o, ops = run(ours, xs)
    y_r, g_r, _ = run(ref, [x.double() for x in xs])
    y_l, g_l, _ = run(theirs, xs) if dtype != torch.float32 else (None, None, None)
    assert op in ops, f"{type(ours).__name__} did not call tessera::{op} (saw {sorted(ops)})"
    for i, (o, r) in enumerate(zip(y_o, y_r)):
        v = tolerance.compare(o, r, None if y_l is None else y_l[i], dtype)
        assert v.ok, f"output {i}: {v.why}"
    for i, (o, r) in enumerate(zip(g_o, g_r)):
        v = tolerance.compare(o, r, None if g_l is None else g_l[i], dtype,
                              (1e-5, 1e-4) if i >= len(xs) else None)  # parameter grads sum over rows
        assert v.ok, f"grad {i}: {v.why}"


# ---------------------------------------------------------------- norms

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm(dtype, affine):
    theirs = _randomize(torch.nn.RMSNorm(40, eps=1e-6, elementwise_affine=affine))
    ours = tnn.RMSNorm(40, eps=1e-6, elementwise_affine=affine)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    check(ours, theirs, [_rand((3, 5, 40), dtype, 0)], dtype, "rms_norm")


def test_rms_norm_eps_none_and_multidim():
    theirs = _randomize(torch.nn.RMSNorm((4, 10)))          # eps=None: the dtype's epsilon
    ours = tnn.RMSNorm((4, 10), eps=None)
    ours.load_state_dict(theirs.state_dict())
    check(ours, theirs, [_rand((6, 4, 10), torch.float32, 2)], torch.float32, "rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_layer_norm(dtype, affine, bias):
    theirs = _randomize(torch.nn.LayerNorm(40, eps=1e-5, elementwise_affine=affine, bias=bias))
    ours = tnn.LayerNorm(40, eps=1e-5, elementwise_affine=affine, bias=bias)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    check(ours, theirs, [_rand((3, 5, 40), dtype, 0)], dtype, "layer_norm")


def test_layer_norm_multidim():
    theirs = _randomize(torch.nn.LayerNorm((3, 7)))
    ours = tnn.LayerNorm((3, 7))
    ours.load_state_dict(theirs.state_dict())
    check(ours, theirs, [_rand((5, 3, 7), torch.float32, 3)], torch.float32, "layer_norm")


def test_state_dict_round_trip_into_torch():
    for ours, theirs in ((tnn.RMSNorm(16), torch.nn.RMSNorm(16)), (tnn.LayerNorm(16), torch.nn.LayerNorm(16))):
        _randomize(ours)
        theirs.load_state_dict(ours.state_dict())            # strict, both directions
        for k, v in ours.state_dict().items():
            assert torch.equal(v, theirs.state_dict()[k])


class _Fused(torch.nn.Module):
    """The unfused pre-norm block ``h = x + r; y = norm(h)`` (what the residual path replaces)."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x, r):
        h = x + r
        return self.norm(h), h


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_residual_path(dtype, kind):
    theirs = _randomize(torch.nn.RMSNorm(24, eps=1e-6) if kind == "rms" else torch.nn.LayerNorm(24))
    ours = tnn.RMSNorm(24) if kind == "rms" else tnn.LayerNorm(24)
    ours.load_state_dict(theirs.state_dict())
    x, r = _rand((4, 3, 24), dtype, 4), _rand((4, 3, 24), dtype, 5)
    y, h = ours.to(dtype)(x, r)
    assert torch.equal(h, x + r), "h must be x + residual rounded to x's dtype"
    check(ours, _Fused(theirs), [x, r], dtype, "rms_norm" if kind == "rms" else "layer_norm",
          call=lambda m, a, b: m(a, b))


def test_norm_factory_kwargs_and_errors():
    m = tnn.RMSNorm(8, dtype=torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16 and m.weight.shape == (8,)
    assert tnn.LayerNorm(8, device="meta").bias.device.type == "meta"
    assert torch.equal(tnn.LayerNorm(8).weight, torch.ones(8)) and torch.equal(tnn.LayerNorm(8).bias, torch.zeros(8))
    for bad in (0, (), (4, -1)):
        with pytest.raises(ValueError, match="normalized_shape"):
            tnn.RMSNorm(bad)
    with pytest.raises(ValueError, match="normalized_shape"):
        tnn.LayerNorm((2, 8))(torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match=r"'x' of shape \(3, 9\).*normalized_shape \(8,\)"):
        tnn.RMSNorm(8)(torch.randn(3, 9))
    with pytest.raises(ValueError, match="'residual'"):
        tnn.RMSNorm(8)(torch.randn(3, 8), torch.randn(3, 9))


# ---------------------------------------------------------------- activations

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dtype, approximate):
    check(tnn.GELU(approximate), torch.nn.GELU(approximate), [_rand((6, 33), dtype, 0, 3.0)], dtype, "gelu")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu(dtype):
    check(tnn.SiLU(), torch.nn.SiLU(), [_rand((6, 33), dtype, 0, 3.0)], dtype, "silu")


def test_silu_inplace():
    x = _rand((4, 9), torch.float32, 1)
    want = F.silu(x)
    out = tnn.SiLU(inplace=True)(x)
    assert out is x
    torch.testing.assert_close(x, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax(dtype, dim):
    check(tnn.Softmax(dim), torch.nn.Softmax(dim), [_rand((5, 6, 17), dtype, 0, 2.0)], dtype, "softmax")


class _Gated(torch.nn.Module):
    """The torch composition a gated module replaces: ``act(gate) * up``."""

    def __init__(self, act):
        super().__init__()
        self.act = act

    def forward(self, gate, up=None):
        if up is None:
            gate, up = gate.chunk(2, dim=-1)
        return self.act(gate) * up


_GATED = [("swiglu", lambda: tnn.SwiGLU(), lambda: _Gated(torch.nn.SiLU())),
          ("geglu", lambda: tnn.GEGLU(), lambda: _Gated(torch.nn.GELU())),
          ("geglu", lambda: tnn.GEGLU("tanh"), lambda: _Gated(torch.nn.GELU("tanh")))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,ours,theirs", _GATED, ids=["swiglu", "geglu", "geglu-tanh"])
def test_gated_two_inputs(dtype, op, ours, theirs):
    check(ours(), theirs(), [_rand((4, 3, 20), dtype, 0, 2.0), _rand((4, 3, 20), dtype, 1)], dtype, op)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,ours,theirs", _GATED, ids=["swiglu", "geglu", "geglu-tanh"])
def test_gated_single_input_is_chunked(dtype, op, ours, theirs):
    x = _rand((4, 3, 40), dtype, 2, 2.0)
    check(ours(), theirs(), [x], dtype, op)
    gate, up = x.chunk(2, dim=-1)                       # first half is the gate
    assert torch.equal(ours()(x), ours()(gate, up))


def test_gated_and_activation_errors():
    with pytest.raises(ValueError, match="even"):
        tnn.SwiGLU()(torch.randn(3, 7))
    with pytest.raises(ValueError, match="approximate"):
        tnn.GELU("bogus")
    with pytest.raises(ValueError, match="approximate"):
        tnn.GEGLU("exact")


# ---------------------------------------------------------------- in a model

def test_in_a_model_trains():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), tnn.SwiGLU(), tnn.LayerNorm(32),
                                torch.nn.Linear(32, 16), tnn.GELU("tanh"), tnn.RMSNorm(16), tnn.SiLU(),
                                torch.nn.Linear(16, 8), tnn.Softmax())
    x = torch.randn(10, 16)
    model(x).pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert "Softmax(dim=-1)" in repr(model)


def test_all_exported():
    assert set(tnn.__all__) == {"RMSNorm", "LayerNorm", "GELU", "SiLU", "SwiGLU", "GEGLU", "Softmax",
                                "RotaryEmbedding", "QuantLinear", "Conv2d", "fold_batchnorm"}
    assert tessera.nn is tnn
