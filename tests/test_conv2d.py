"""tessera.conv2d beyond the generic matrix: hypothesis fuzz of shapes/strides/groups/layouts
(the row fuzz of test_fuzz.py cannot build conv inputs), memory format of the output,
option errors, tessera.nn.Conv2d and tessera.fold_batchnorm."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, backend_available
from tessera.ops.conv2d import _build
from tessera.testing.matrix import run_case

EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25"))
NATIVE = [b for b in ("cpu",) if backend_available(b, torch.device("cpu"))[0]]
SPEC = tessera.OPS["conv2d"]


@st.composite
def conv_case(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    depthwise = draw(st.booleans())
    cing = 1 if depthwise else draw(st.integers(1, 5))
    mult = draw(st.integers(1, 2)) if depthwise else draw(st.integers(1, 7))
    groups = draw(st.integers(1, 20)) if depthwise else groups  # >= 16: the vector channel blocks
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    same = s == (1, 1) and draw(st.booleans())
    pad = "same" if same else (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    h = draw(st.integers(max(1, d[0] * (kh - 1) + 1 - 2 * (0 if same else pad[0])), 11))
    w = draw(st.integers(max(1, d[1] * (kw - 1) + 1 - 2 * (0 if same else pad[1])), 21))  # 8-pixel tiles
    n = draw(st.integers(0, 2))
    layout = draw(st.sampled_from(["nchw", "cl", "view", "clview"]))
    act = draw(st.sampled_from([None, "relu", "relu6", "silu", "gelu"]))
    bias = draw(st.booleans())
    name = f"fuzz[n{n} c{cing * groups} {h}x{w} o{mult * groups} k{kh}x{kw} s{s} d{d} p{pad} g{groups} {layout} {act}]"
    return _build(name, (n, cing * groups, h, w), (mult * groups, cing, kh, kw), bias=bias, layout=layout,
                  stride=s, padding=pad, dilation=d, groups=groups, activation=act)


@pytest.mark.fuzz  # `pytest -m fuzz`: EXAMPLES becomes >= 1000 (tests/conftest.py)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", NATIVE)
def test_fuzz_conv2d_vs_reference(backend, dtype):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("TESSERA_FUZZ_RANDOM") != "1",
              database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=conv_case())
    def check(case: Case):
        r = run_case(SPEC, backend, dtype, case)
        assert r.ok, f"{case.name}: {r.why}"

    check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("xs,k,layout,conv", [
    ((1, 133, 3, 5), 3, "cl", dict(padding=1)),     # 8 channel blocks + a 5-channel tail on 3 rows: channel chunks
    ((2, 160, 2, 9), 3, "nchw", dict(padding=1, stride=(1, 2))),  # chunks, stride-2 border tiles
    ((1, 48, 5, 30), 3, "cl", dict(padding=2, dilation=2)),       # border tiles both sides, interior tiles
    ((1, 40, 3, 25), 5, "clview", dict(padding=(1, 3))),          # 5x5: the generic interior path, a partial tile
    ((1, 32, 4, 12), 9, "cl", dict(padding=4)),      # 81 taps: beyond the pointer table, one pixel at a time
    ((1, 16, 1, 1), 3, "cl", dict(padding=1)),       # every tap but the centre reads the zero row
    # 3x3 stride 1: runs of interior tiles (channel-block pairs + a single block), edge tiles
    ((1, 48, 6, 40), 3, "cl", dict(padding=(0, 1))),  # interior run of 3 tiles, full and partial edges
    ((2, 32, 7, 7), 3, "nchw", dict(padding=2)),     # window columns 0-1 outside x, NCHW stores
    ((1, 16, 5, 17), 3, "clview", dict(padding=1)),  # one block, strided view input
    ((1, 48, 5, 37), 3, "cl", dict(padding=1, stride=2)),  # stride-2 window: interior run and edges
    ((1, 16, 4, 16), 3, "nchw", dict(padding=(1, 0), stride=2)),  # stride 2, no column padding
    # a channel tail (C % 16) runs as one more block overlapping the last full one, on every path
    ((1, 24, 5, 37), 3, "cl", dict(padding=1)),      # stride-1 interior runs and edges
    ((2, 40, 6, 23), 3, "nchw", dict(padding=1, stride=2)),  # stride 2, NCHW stores
    ((1, 21, 4, 11), 5, "clview", dict(padding=2)),  # the generic and pointer-table paths
    ((1, 7, 5, 9), 3, "cl", dict(padding=1)),        # fewer than 16 channels: the pixel loop
])
def test_depthwise_tiles_and_chunks(backend, xs, k, layout, conv, dtype, monkeypatch):
    """The depthwise kernel's paths (runs of interior tiles, 3x3 stride-1 edge tiles with zero window
    columns, other border tiles through the zero-row pointer table, the large-kernel fallback,
    channel chunks for short images with many channels) vs float64, in every dtype: a bf16 / fp16
    channels-last x is read in place by the per-dtype instantiations of those paths."""
    monkeypatch.setenv("TESSERA_DISPATCH", "kernel")
    c = xs[1]
    case = _build(f"dw-{xs}-k{k}", xs, (c, 1, k, k), layout=layout, groups=c, activation="relu6", **conv)
    r = run_case(SPEC, backend, dtype, case)
    assert r.ok, r.why


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", [None, "relu6"])
def test_depthwise_half_output_is_the_fp32_sum_rounded_once(dtype, act, monkeypatch):
    """A half-precision channels-last depthwise conv is read in place and stored from registers
    (bf16: the AVX512_BF16 convert where the CPU has it, integer RNE on a vector holding a denormal).
    Its output must be, bit for bit, the fp32 kernel's output on the same (exactly widened) values
    rounded once: denormal sums, NaN and inf included."""
    if not NATIVE:
        pytest.skip("no native cpu backend")
    monkeypatch.setenv("TESSERA_DISPATCH", "kernel")
    g = torch.Generator().manual_seed(5)
    c = 48
    x = torch.randn(2, c, 9, 21, generator=g)
    x[0] *= 3e-39 if dtype == torch.bfloat16 else 3e-6          # sums in the target's denormal range
    x[1, 3, 4, 7], x[1, 5, 2, 2] = float("nan"), float("inf")
    x = x.to(dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(c, 1, 3, 3, generator=g).to(dtype)
    y = tessera.conv2d(x, w, padding=1, groups=c, activation=act, backend="cpu")
    y32 = tessera.conv2d(x.float(), w.float(), padding=1, groups=c, activation=act, backend="cpu")
    tiny = torch.finfo(dtype).tiny
    assert ((y32.abs() < tiny) & (y32 != 0)).sum() > 100                # the denormal path ran
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, y32.to(dtype), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["reference"] + NATIVE)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["nchw", "cl"])
def test_output_memory_format_follows_x(backend, fmt):
    x = torch.randn(2, 4, 9, 7).contiguous(memory_format=fmt)
    w = torch.randn(6, 4, 3, 3)
    y = tessera.conv2d(x, w, padding=1, backend=backend)
    assert y.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kw,needle", [
    (dict(padding="full"), "'padding'"),
    (dict(padding="same", stride=2), "'padding'"),
    (dict(stride=0), "'stride'"),
    (dict(dilation=(1, 0)), "'dilation'"),
    (dict(padding=-1), "'padding'"),
    (dict(groups=3), "'weight'"),
    (dict(activation="tanh"), "'activation'"),
])
def test_bad_options(kw, needle):
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    with pytest.raises(ValueError) as info:
        tessera.conv2d(x, w, **kw, backend="cpu")
    assert needle in str(info.value)


def test_weight_larger_than_input_is_an_error():
    with pytest.raises(ValueError, match="'weight'"):
        tessera.conv2d(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 5, 5), backend="cpu")


def _cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 1), torch.nn.BatchNorm2d(16))


def test_checked_signatures_still_reject_bad_calls():
    """_check remembers argument signatures that passed; a call that differs in anything it
    checks (dtype, a bias of the wrong size, groups) is still validated and rejected."""
    from tessera.ops import conv2d as conv_mod
    x, w, b = torch.randn(1, 4, 5, 5), torch.randn(6, 4, 3, 3), torch.randn(6)
    tessera.conv2d(x, w, b, padding=1)
    tessera.conv2d(x, w, b, padding=1)              # served from the memo
    assert any(k[0] == x.shape and k[3] == w.shape for k in conv_mod._CHECKED)
    with pytest.raises(ValueError, match="bias"):
        tessera.conv2d(x, w, torch.randn(5), padding=1)
    with pytest.raises(TypeError, match="same dtype"):
        tessera.conv2d(x, w.to(torch.bfloat16), b, padding=1)
    with pytest.raises(ValueError, match="groups"):
        tessera.conv2d(x, w, b, padding=1, groups=3)


def test_nn_conv2d_is_a_drop_in():
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(5, 6, 3, stride=2, padding=1, groups=1)
    mine = tessera.nn.Conv2d(5, 6, 3, stride=2, padding=1, activation="silu")
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 9, 9, requires_grad=True)
    y = mine(x)
    torch.testing.assert_close(y, F.silu(ref(x)), rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(y.sum(), [mine.weight])
    (gr,) = torch.autograd.grad(F.silu(ref(x)).sum(), [ref.weight])
    torch.testing.assert_close(g, gr, rtol=1e-4, atol=1e-4)
    shared = tessera.nn.Conv2d.from_torch(ref)
    assert shared.weight is ref.weight
    torch.testing.assert_close(shared(x), ref(x), rtol=1e-5, atol=1e-5)


def test_fold_batchnorm_matches_eval_outputs():
    torch.manual_seed(0)
    model = _cnn()
    model.train()
    for _ in range(3):  # non-trivial running statistics
        model(torch.randn(4, 3, 12, 12) * 2 + 0.5)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    model.eval()
    x = torch.randn(2, 3, 12, 12)
    want = model(x)
    with pytest.raises(ValueError, match="eval"):
        tessera.fold_batchnorm(_cnn().train())
    folded = tessera.fold_batchnorm(model)
    convs = [m for m in folded.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 3 and all(isinstance(m, tessera.nn.Conv2d) for m in convs)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    torch.testing.assert_close(folded(x), want, rtol=1e-4, atol=1e-4)


def test_packed_weight_cache_sees_in_place_updates():
    """The cpu launcher memoises packed weights per tensor; an in-place update must repack."""
    x, w = torch.randn(1, 8, 6, 6), torch.randn(16, 8, 3, 3)
    y1 = tessera.conv2d(x, w, padding=1, backend="cpu")
    torch.testing.assert_close(y1, F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        w.mul_(-2.0)
    y2 = tessera.conv2d(x, w, padding=1, backend="cpu")
    torch.testing.assert_close(y2, F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)
    w2 = w.clone()  # a different tensor (maybe at a freed address) never hits w's entry
    del w
    torch.testing.assert_close(tessera.conv2d(x, w2 * 0.5, padding=1, backend="cpu"),
                               F.conv2d(x, w2 * 0.5, padding=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dw", [False, True], ids=["dense", "depthwise"])
@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_relu_backward_masks_dy_with_the_saved_output(act, dw, monkeypatch):
    """relu / relu6: the backward reads act'(z) from the saved y (no recompute of z), so the backend
    is asked for a plain conv backward; the gradient equals eager's conv + relu, kinks included
    (integer data puts sums exactly on 0 and 6, where PyTorch's gradient is 0)."""
    from tessera.ops.conv2d import cpu as conv_cpu
    seen = []
    real = conv_cpu.backward
    monkeypatch.setattr(conv_cpu, "backward", lambda *a: seen.append(a[8]) or real(*a))
    g = torch.Generator().manual_seed(3)
    c = 16 if dw else 3
    x = torch.randint(-2, 3, (2, c, 7, 9), generator=g).float().contiguous(memory_format=torch.channels_last)
    w = torch.randint(-1, 2, (c, 1 if dw else c, 3, 3), generator=g).float()
    b = torch.randint(0, 7, (c,), generator=g).float()
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    y = tessera.conv2d(xs, ws, bs, padding=1, groups=c if dw else 1, activation=act, backend="cpu")
    ye = (F.relu if act == "relu" else F.relu6)(F.conv2d(x.double(), w.double(), b.double(), padding=1,
                                                         groups=c if dw else 1))
    assert ((ye == 0).sum() > 0) and (act == "relu" or (ye == 6).sum() > 0)   # kinks are hit
    dy = torch.randn(y.shape, generator=g)
    got = torch.autograd.grad(y, (xs, ws, bs), dy)
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    zr = F.conv2d(xr, wr, br, padding=1, groups=c if dw else 1)
    want = torch.autograd.grad((F.relu if act == "relu" else F.relu6)(zr), (xr, wr, br), dy.double())
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-4)
    assert seen == [None]


def test_relu_output_modified_in_place_is_an_autograd_error():
    """The saved y is version-checked like eager relu's output: an in-place edit before backward
    raises autograd's error instead of giving a wrong gradient."""
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    y = tessera.conv2d(x, torch.randn(4, 4, 3, 3), padding=1, activation="relu", backend="cpu")
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("mode", ["kernel", "vendor"])
@pytest.mark.parametrize("dw", [False, True], ids=["dense", "depthwise"])
@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_backward_op_with_a_relu_activation(act, dw, mode, monkeypatch):
    """``tessera::conv2d_backward`` called with relu / relu6 itself (autograd masks dy first and
    passes None, so only a direct call reaches these paths): the native pack's mask product and
    the vendor route's threshold / hardtanh backward, against float64 autograd, kinks included."""
    monkeypatch.setenv("TESSERA_DISPATCH", mode)
    g = torch.Generator().manual_seed(7)
    c = 16 if dw else 3
    groups = c if dw else 1
    x = torch.randint(-2, 3, (2, c, 7, 9), generator=g).float().contiguous(memory_format=torch.channels_last)
    w = torch.randint(-1, 2, (c, 1 if dw else c, 3, 3), generator=g).float()
    b = torch.randint(0, 7, (c,), generator=g).float()
    dy = torch.randn(2, c, 7, 9, generator=g).contiguous(memory_format=torch.channels_last)
    dx, dwt, db = torch.ops.tessera.conv2d_backward(dy, x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], groups, act, True,
                                                    "cpu")
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    z = F.conv2d(xr, wr, br, padding=1, groups=groups)
    assert (z == 0).any() and (act == "relu" or (z == 6).any())   # kinks are hit
    want = torch.autograd.grad((F.relu if act == "relu" else F.relu6)(z), (xr, wr, br), dy.double())
    for got, e in zip((dx, dwt, db), want):
        torch.testing.assert_close(got.double(), e, rtol=1e-5, atol=1e-4)
