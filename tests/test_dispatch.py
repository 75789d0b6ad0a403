"""Kernel-or-vendor dispatch of the cpu backend (``tessera.dispatch``, ``TESSERA_DISPATCH``).

* forced ``kernel`` and forced ``vendor`` both match the float64 reference within the op's
  tolerance, for every quantized linear (odd M in 1, 7, 123; K a multiple of the group) and conv2d;
* the integer recipes keep the integer contract on the vendor route: on inputs whose float
  epilogue is exact (integer activations whose token scale is 1, power-of-two weight scales) the
  two routes are bit-identical, so the quantized activations and integer sums agree exactly;
* the dequantized-weight cache follows in-place updates of the weight's scales;
* bad ``TESSERA_DISPATCH`` values raise a ValueError naming the variable; ``auto`` picks a
  valid route and never the vendor route for decode (M = 1).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tessera
from tessera import dispatch
from tessera.ops._qlinear_int4 import quantize_weight
from tessera.quant import contract
from tessera.testing.tolerance import compare

INT4 = ("linear_w4a16", "linear_w4a8")
INT8 = ("linear_w8a8", "linear_a16w8")
DTYPES = (torch.float32, torch.bfloat16)


def _kwargs(op, M, K, N, dtype, gen, bias=False, act=None, zp=False):
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = torch.randn(N, K, generator=gen)
    if op in INT4:
        q, s, z = quantize_weight(w, 64, zp)
        kw = {"x": x, "weight": q, "weight_scale": s, "weight_zero": z, "group_size": 64}
    else:
        q, s = contract.quantize_rows(w * 0.05, torch.int8)
        kw = {"x": x, "weight": q, "weight_scale": s}
    kw["bias"] = torch.randn(N, generator=gen).to(dtype) if bias else None
    kw["activation"] = act
    return kw


def _run(op, kw, mode, monkeypatch):
    monkeypatch.setenv("TESSERA_DISPATCH", mode)
    before = dispatch.counts.get((op, mode), 0)
    y = getattr(tessera, op)(**kw, backend="cpu")
    assert dispatch.counts.get((op, mode), 0) == before + 1, f"{op} did not take the {mode} route"
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", (1, 7, 123))
@pytest.mark.parametrize("op", INT4 + INT8)
def test_both_routes_match_the_reference(op, M, dtype, monkeypatch):
    spec = tessera.OPS[op]
    gen = torch.Generator().manual_seed(M)
    kw = _kwargs(op, M, 256, 37, dtype, gen, bias=True, act="silu", zp=(M == 7))
    ref = spec.ref(**kw)
    eager = spec.eager(**kw)
    for mode in ("kernel", "vendor"):
        y = _run(op, kw, mode, monkeypatch)
        v = compare(y, ref, eager, dtype, tol=spec.fp32_tol.get(0))
        assert v.ok, f"{op} {mode} {dtype} M={M}: {v.message}"


def _exact_int8_inputs(bits, M, K, N, gen):
    """Integer x whose every row holds +-QMAX (token scale exactly 1, qx = x) and power-of-two
    weight scales: the fp32 epilogue fp32(acc) * (1 * sw) then rounds only in fp32(acc)."""
    qmax = 127 if bits == 8 else 32767
    x = torch.randint(-qmax, qmax + 1, (M, K), generator=gen).float()
    x[:, 0] = qmax
    w = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
    sw = 2.0 ** torch.randint(-8, 0, (N,), generator=gen).float()
    return {"x": x, "weight": w, "weight_scale": sw, "bias": None, "activation": None}


@pytest.mark.parametrize("M", (1, 7, 123))
@pytest.mark.parametrize("op", INT8)
def test_int8_recipes_integer_part_is_exact(op, M, monkeypatch):
    kw = _exact_int8_inputs(8 if op == "linear_w8a8" else 16, M, 256, 37, torch.Generator().manual_seed(M))
    k = _run(op, kw, "kernel", monkeypatch)
    v = _run(op, kw, "vendor", monkeypatch)
    assert torch.equal(k, v)
    assert torch.equal(v.double(), tessera.OPS[op].ref(**kw).float().double())


@pytest.mark.parametrize("M", (1, 7, 123))
def test_w4a8_integer_part_is_exact(M, monkeypatch):
    """Power-of-two group scales small enough that every partial sum of acc_g * s_g is an exact
    fp32 value (tests/test_qlinear_int4.py's argument): only the final * sx rounds, on both routes."""
    gen = torch.Generator().manual_seed(M)
    K, N, g = 256, 37, 64
    x = torch.randn(M, K, generator=gen)
    codes = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8)
    from tessera.ops._qlinear_int4 import pack_int4
    s = 2.0 ** torch.randint(-6, -2, (N, K // g), generator=gen).float()
    kw = {"x": x, "weight": pack_int4(codes), "weight_scale": s, "weight_zero": None, "group_size": g,
          "bias": None, "activation": None}
    k = _run("linear_w4a8", kw, "kernel", monkeypatch)
    v = _run("linear_w4a8", kw, "vendor", monkeypatch)
    assert torch.equal(k, v)


def test_w4a16_vendor_cache_follows_scale_updates(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    kw = _kwargs("linear_w4a16", 5, 128, 16, torch.float32, gen)
    a = _run("linear_w4a16", kw, "vendor", monkeypatch)
    assert torch.equal(_run("linear_w4a16", kw, "vendor", monkeypatch), a)
    kw["weight_scale"].mul_(2)  # in place: the version counter changes, the cached copy is rebuilt
    b = _run("linear_w4a16", kw, "vendor", monkeypatch)
    torch.testing.assert_close(b, 2 * a)
    monkeypatch.setattr(dispatch, "CACHE_BYTES", 0)  # past the budget: auto keeps the kernel
    dispatch.clear_cache()
    assert not dispatch.cache_ok("w4a16", kw["weight"], torch.float32, 1)


CONV = [  # (x shape, weight shape, stride, padding, dilation, groups, activation, channels-last)
    ((2, 8, 9, 11), (12, 8, 3, 3), 1, 1, 1, 1, "relu", False),
    ((1, 6, 10, 7), (6, 3, 2, 2), 1, "same", 1, 2, "gelu", True),      # asymmetric pads
    ((3, 16, 8, 8), (16, 1, 3, 3), 2, 1, 1, 16, "relu6", True),       # depthwise
    ((1, 4, 13, 12), (5, 4, 3, 1), (2, 1), 0, (1, 2), 1, "silu", False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", range(len(CONV)))
def test_conv2d_vendor_matches_kernel_and_reference(case, dtype, monkeypatch):
    xs, ws, s, p, d, g, act, cl = CONV[case]
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(*xs, generator=gen).to(dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(*ws, generator=gen) * 0.3).to(dtype)
    b = torch.randn(ws[0], generator=gen).to(dtype)
    spec = tessera.OPS["conv2d"]
    kw = dict(x=x, weight=w, bias=b, stride=s, padding=p, dilation=d, groups=g, activation=act)
    ref, eager = spec.ref(**kw), spec.eager(**kw)
    outs = {}
    for mode in ("kernel", "vendor"):
        monkeypatch.setenv("TESSERA_DISPATCH", mode)
        outs[mode] = y = tessera.conv2d(**kw, backend="cpu")
        v = compare(y, ref, eager, dtype, tol=spec.fp32_tol.get(0))
        assert v.ok, f"conv2d {mode} {dtype}: {v.message}"
    assert outs["vendor"].stride() == outs["kernel"].stride()  # same memory format either way


@pytest.mark.parametrize("bad", ("fast", "KERNEL", "1"))
def test_bad_mode_names_the_variable(bad, monkeypatch):
    monkeypatch.setenv("TESSERA_DISPATCH", bad)
    with pytest.raises(ValueError, match="TESSERA_DISPATCH"):
        dispatch.mode()
    kw = _kwargs("linear_w8a8", 3, 64, 8, torch.float32, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="TESSERA_DISPATCH"):
        tessera.linear_w8a8(**kw, backend="cpu")


def test_auto_picks_a_valid_route(monkeypatch):
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    assert dispatch.mode() == "auto"
    for key in dispatch.DEFAULTS:
        op, dt = key.split(":")
        dtype = getattr(torch, dt)
        for M in (1, 16, 128, 512, 4096):
            r = dispatch.route(op, dtype, M, 2048, 2048)
            assert r in ("kernel", "vendor")
            if M < dispatch.MIN_M:
                assert r == "kernel", f"{key}: auto routed a decode call (M={M}) to the vendor"
    # even a threshold of 1 keeps decode on the kernel, and a weight that cannot be cached too
    monkeypatch.setattr(dispatch, "thresholds", lambda: {k: 1 for k in dispatch.DEFAULTS})
    assert dispatch.route("linear_w4a16", torch.bfloat16, 1, 4096, 4096) == "kernel"
    assert dispatch.route("linear_w4a16", torch.bfloat16, 512, 4096, 4096) == "vendor"
    assert dispatch.route("linear_w4a16", torch.bfloat16, 512, 4096, 4096, lambda: False) == "kernel"
    assert dispatch.route("linear_w4a16", torch.bfloat16, 512, 8, 8) == "kernel"  # tiny N * K


def test_auto_runs_and_matches(monkeypatch):
    """Under auto a prefill-sized bf16 W4A16 call takes whichever route the rule says, correctly."""
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    gen = torch.Generator().manual_seed(1)
    kw = _kwargs("linear_w4a16", 64, 512, 512, torch.bfloat16, gen)
    want = dispatch.route("linear_w4a16", torch.bfloat16, 64, 512, 512)
    before = dispatch.counts.get(("linear_w4a16", want), 0)
    y = tessera.linear_w4a16(**kw, backend="cpu")
    assert dispatch.counts.get(("linear_w4a16", want), 0) == before + 1
    spec = tessera.OPS["linear_w4a16"]
    assert compare(y, spec.ref(**kw), spec.eager(**kw), torch.bfloat16).ok


def test_calibration_file_round_trip(tmp_path, monkeypatch):
    """A calibration (tiny here) lands in the cache dir and becomes the process's rule."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    dispatch.thresholds.cache_clear()
    try:
        res = dispatch.calibrate(ms=(16, 32), n=64, k=128, dtypes=(torch.float32,), ops=("linear_w8a8",),
                                 rounds=1, log=None)
        assert dispatch.calibration_path().exists()
        assert dispatch.thresholds()["linear_w8a8:float32"] == res["thresholds"]["linear_w8a8:float32"]
    finally:
        dispatch.thresholds.cache_clear()


def test_w4a16_new_scale_tensors_every_call_stop_auto_caching(monkeypatch):
    """A caller handing in a fresh scale tensor on every call would rebuild the cached weight each
    time: after MAX_REBUILDS rebuilds auto keeps that weight on the kernel, results stay right."""
    gen = torch.Generator().manual_seed(4)
    kw = _kwargs("linear_w4a16", 5, 128, 16, torch.float32, gen)
    want = _run("linear_w4a16", kw, "kernel", monkeypatch)
    for _ in range(dispatch.MAX_REBUILDS + 2):
        y = _run("linear_w4a16", dict(kw, weight_scale=kw["weight_scale"].clone()), "vendor", monkeypatch)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-4)
    assert not dispatch.cache_ok("w4a16", kw["weight"], torch.float32, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", range(len(CONV)))
def test_conv2d_backward_routes_match_reference(case, dtype, monkeypatch):
    """Forward and (dx, dweight, dbias) on both routes vs float64 autograd (the contract matrix's
    run_case), on asymmetric pads, groups, dilation, both layouts and every activation."""
    from tessera.ops.conv2d import _build
    from tessera.testing.matrix import run_case
    xs, ws, s, p, d, g, act, cl = CONV[case]
    c = _build(f"dispatch-{case}", xs, ws, layout="cl" if cl else "nchw", stride=s, padding=p, dilation=d,
               groups=g, activation=act)
    for mode in ("kernel", "vendor"):
        monkeypatch.setenv("TESSERA_DISPATCH", mode)
        before = dict(dispatch.counts)
        r = run_case(tessera.OPS["conv2d"], "cpu", dtype, c)
        assert r.ok, f"conv2d {mode} {dtype}: {r.why}"
        key = ("conv2d_dw_bwd" if g == xs[1] == ws[0] else "conv2d_bwd", mode)
        assert dispatch.counts.get(key, 0) > before.get(key, 0), f"the backward did not take the {mode} route"


def test_builtin_table_follows_the_cpu_vendor(monkeypatch, tmp_path):
    """Without a calibration file the rule is the CPU vendor's table (same keys in both)."""
    assert dispatch.DEFAULTS_INTEL.keys() == dispatch.DEFAULTS.keys()
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))  # no calibration file here
    for vendor, table in (("GenuineIntel", dispatch.DEFAULTS_INTEL), ("AuthenticAMD", dispatch.DEFAULTS),
                          ("", dispatch.DEFAULTS)):
        monkeypatch.setattr(dispatch, "cpu_vendor", lambda v=vendor: v)
        dispatch.thresholds.cache_clear()
        try:
            assert dispatch.thresholds() == table, vendor
        finally:
            dispatch.thresholds.cache_clear()


def test_few_channel_conv_floor_follows_the_cpu_vendor(monkeypatch):
    """A dense conv (3x3 or 1x1) under CONV_NK_MIN stays on the kernel, except on Intel (oneDNN wins
    there at every few-channel shape measured, AMX in bf16); the floor never applies to depthwise."""
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    monkeypatch.setattr(dispatch, "thresholds", lambda: {f"{op}:{dt}": 16 for op in ("conv2d", "conv2d_1x1")
                                                         for dt in ("float32", "bfloat16")})
    stem = (64, 3 * 7 * 7)                       # N * K = 9408 < CONV_NK_MIN
    for vendor, want in (("GenuineIntel", {torch.float32: "vendor", torch.bfloat16: "vendor"}),
                         ("AuthenticAMD", {torch.float32: "kernel", torch.bfloat16: "kernel"})):
        monkeypatch.setattr(dispatch, "cpu_vendor", lambda v=vendor: v)
        for dtype, r in want.items():
            assert dispatch.route("conv2d", dtype, 12544, *stem) == r, (vendor, dtype)
            assert dispatch.route("conv2d_1x1", dtype, 12544, 96, 16) == r, (vendor, dtype)
            assert dispatch.route("conv2d", dtype, 12544, 64, 64 * 9) == "vendor"   # above the floor


def test_pointwise_convs_have_their_own_key(monkeypatch):
    """A dense 1x1 conv asks the table under "conv2d_1x1" (a GEMM over channels: in fp32 on Intel
    the kernel wins it at small M where oneDNN wins 3x3 convs), 3x3 under "conv2d"."""
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    assert set(k for k in dispatch.DEFAULTS if k.startswith("conv2d_1x1:")) == \
        {"conv2d_1x1:float32", "conv2d_1x1:bfloat16", "conv2d_1x1:float16"}
    monkeypatch.setattr(dispatch, "thresholds", lambda: {"conv2d:float32": 16, "conv2d_1x1:float32": None})
    x = torch.randn(1, 64, 9, 9).contiguous(memory_format=torch.channels_last)
    for k, key, route in ((1, "conv2d_1x1", "kernel"), (3, "conv2d", "vendor")):
        w, b = torch.randn(384, 64, k, k) * 0.05, torch.randn(384)
        before = {r: dispatch.counts.get((key, r), 0) for r in ("kernel", "vendor")}
        y = tessera.conv2d(x, w, b, padding=k // 2, activation="relu", backend="cpu")
        assert dispatch.counts.get((key, route), 0) == before[route] + 1, (k, key)
        torch.testing.assert_close(y, F.relu(F.conv2d(x, w, b, padding=k // 2)), rtol=1e-4, atol=1e-4)


def test_narrow_pointwise_convs_ask_their_own_key(monkeypatch):
    """A 1x1 conv with at most NARROW_COUT output channels asks under "conv2d_1x1n" where the table
    has that key (the kernel keeps winning it to a larger M), else under "conv2d_1x1"; the
    count stays under the op's key.  Every table has the key in every dtype.  No NK floor here
    (CONV_NK_MIN: AMD's default floor would keep these small layers on the kernel whatever the key)."""
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    monkeypatch.setattr(dispatch, "CONV_NK_MIN", 0)
    monkeypatch.setattr(dispatch, "CONV_NK_MIN_BY_VENDOR", {})
    for table in (dispatch.DEFAULTS, dispatch.DEFAULTS_INTEL):
        assert {k for k in table if k.startswith("conv2d_1x1n:")} == \
            {"conv2d_1x1n:float32", "conv2d_1x1n:bfloat16", "conv2d_1x1n:float16"}
    n = dispatch.NARROW_COUT
    monkeypatch.setattr(dispatch, "thresholds", lambda: {"conv2d_1x1:float32": 16, "conv2d_1x1n:float32": 6272})
    assert dispatch.route("conv2d_1x1", torch.float32, 3136, n, 144) == "kernel"
    assert dispatch.route("conv2d_1x1", torch.float32, 6272, n, 144) == "vendor"
    assert dispatch.route("conv2d_1x1", torch.float32, 3136, n + 1, 144) == "vendor"
    monkeypatch.setattr(dispatch, "thresholds", lambda: {"conv2d_1x1:float32": 16})   # no narrow key: the 1x1 one
    assert dispatch.route("conv2d_1x1", torch.float32, 3136, n, 144) == "vendor"
    monkeypatch.setattr(dispatch, "thresholds", lambda: {"conv2d_1x1:float32": 16, "conv2d_1x1n:float32": None})
    x = torch.randn(1, 48, 20, 20).contiguous(memory_format=torch.channels_last)
    for cout, route in ((n, "kernel"), (n + 8, "vendor")):
        w, b = torch.randn(cout, 48, 1, 1) * 0.1, torch.randn(cout)
        before = dispatch.counts.get(("conv2d_1x1", route), 0)
        y = tessera.conv2d(x, w, b, backend="cpu")
        assert dispatch.counts.get(("conv2d_1x1", route), 0) == before + 1, cout
        torch.testing.assert_close(y, F.conv2d(x, w, b), rtol=1e-4, atol=1e-4)


def test_threshold_rule_and_bands(monkeypatch):
    """_threshold: a suffix of vendor wins gives its first M; wins only inside the range (two or
    more in a row) give a band [lo, hi) that route() honours; one stray win gives None."""
    pts = lambda wins: [(m, 1.0, 0.5 if w else 1.0) for m, w in zip((16, 32, 64, 128, 256, 512), wins)]
    assert dispatch._threshold(pts([0, 0, 1, 1, 1, 1])) == 64
    assert dispatch._threshold(pts([0, 0, 1, 1, 0, 0])) == [64, 256]
    assert dispatch._threshold(pts([1, 1, 0, 1, 1, 1])) == 128          # the suffix rule comes first
    assert dispatch._threshold(pts([1, 0, 1, 0, 1, 0])) is None          # no run of two
    assert dispatch._threshold(pts([0, 0, 0, 0, 0, 0])) is None
    assert dispatch._threshold([(16, 1.0, 0.97)]) is None                # within MARGIN: not a win
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    monkeypatch.setattr(dispatch, "thresholds", lambda: {"linear_w8a8:float32": [64, 256]})
    got = [dispatch.route("linear_w8a8", torch.float32, M, 2048, 2048) for M in (16, 63, 64, 255, 256, 4096)]
    assert got == ["kernel", "kernel", "vendor", "vendor", "kernel", "kernel"]


def test_nchw_conv_forward_goes_to_the_vendor_under_auto(monkeypatch):
    """auto: a conv2d forward on NCHW x takes oneDNN in fp32 / bf16 (the NHWC kernels would pay
    a layout copy each way), channels-last x follows the table, fp16 and forced modes are kept;
    the NCHW vendor result matches the kernel's within the dtype's tolerance."""
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    monkeypatch.setattr(dispatch, "thresholds", lambda: {k: None for k in dispatch.DEFAULTS})
    assert dispatch.route("conv2d_dw", torch.float32, 3136, 144, 9, nchw=True) == "vendor"
    assert dispatch.route("conv2d", torch.bfloat16, 3136, 64, 576, nchw=True) == "vendor"
    assert dispatch.route("conv2d", torch.float16, 3136, 64, 576, nchw=True) == "kernel"
    assert dispatch.route("conv2d", torch.float32, 1, 64, 576, nchw=True) == "kernel"   # decode-sized
    assert dispatch.route("conv2d", torch.float32, 3136, 64, 576, nchw=False) == "kernel"
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 24, 13, 11, generator=gen)
    w = torch.randn(24, 1, 3, 3, generator=gen)
    b = torch.randn(24, generator=gen)
    before = dispatch.counts.get(("conv2d_dw", "vendor"), 0)
    y = tessera.conv2d(x, w, b, padding=1, groups=24, activation="relu6", backend="cpu")
    assert dispatch.counts.get(("conv2d_dw", "vendor"), 0) == before + 1 and y.is_contiguous()
    with dispatch.forced("kernel"):
        want = tessera.conv2d(x, w, b, padding=1, groups=24, activation="relu6", backend="cpu")
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def _attention_cases():
    return [c for c in tessera.OPS["attention"].cases if "extreme" not in c.tags]


@pytest.mark.parametrize("case", _attention_cases(), ids=lambda c: c.name)
def test_attention_vendor_route_matches_reference(case, monkeypatch):
    """bf16 attention under TESSERA_DISPATCH=vendor: the calls SDPA can express (equal-length
    batches, no window but causal with Lq == Lk, no softcap) run CPU SDPA's flash backward, and
    its forward unless the caller asked for lse (SDPA's lse misses the op's fp32 rule); either way
    out, lse and (dq, dk, dv) pass the contract matrix."""
    from tessera.testing.matrix import run_case
    monkeypatch.setenv("TESSERA_DISPATCH", "vendor")
    shapes, real = [], dispatch.attention_shape
    monkeypatch.setattr(dispatch, "attention_shape", lambda *a: shapes.append(real(*a)) or shapes[-1])
    before = dict(dispatch.counts)
    r = run_case(tessera.OPS["attention"], "cpu", torch.bfloat16, case)
    assert r.ok, f"{case.name}: {r.why}"
    launched = {op: dispatch.counts.get((op, "vendor"), 0) - before.get((op, "vendor"), 0)
                for op in ("attention", "attention_bwd")}
    returns_lse = case.make(torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(0)).get(
        "return_lse", False)
    if any(s is not None for s in shapes):   # SDPA can express it
        assert launched["attention_bwd"] >= 1 and (launched["attention"] >= 1) == (not returns_lse), launched
    else:
        assert launched == {"attention": 0, "attention_bwd": 0}, launched


def test_attention_vendor_route_is_taken_only_where_sdpa_matches():
    """attention_shape: full-length batches only (the cu_seqlens of a padded batch), causal only
    with Lq == Lk (SDPA aligns its causal mask top-left), no window, no softcap, two keys or more."""
    q, k = torch.empty(6, 2, 8), torch.empty(6, 2, 8)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    assert dispatch.attention_shape(q, k, cu, cu, 3, 3, -1, -1, 0.0) == (2, 3, 3, False)
    assert dispatch.attention_shape(q, k, cu, cu, 3, 3, -1, 0, 0.0) == (2, 3, 3, True)
    assert dispatch.attention_shape(q, k, cu, cu, 3, 3, -1, 0, 30.0) is None          # softcap
    assert dispatch.attention_shape(q, k, cu, cu, 3, 3, 2, 0, 0.0) is None            # sliding window
    ragged = torch.tensor([0, 2, 6], dtype=torch.int32)
    assert dispatch.attention_shape(q, k, ragged, ragged, 4, 4, -1, -1, 0.0) is None  # varlen
    assert dispatch.attention_shape(q, k, ragged, ragged, 3, 3, -1, -1, 0.0) is None  # wrong max, same sum
    k2, cu2 = torch.empty(8, 2, 8), torch.tensor([0, 4, 8], dtype=torch.int32)
    assert dispatch.attention_shape(q, k2, cu, cu2, 3, 4, -1, -1, 0.0) == (2, 3, 4, False)
    assert dispatch.attention_shape(q, k2, cu, cu2, 3, 4, -1, 0, 0.0) is None          # causal, Lq != Lk
    one = torch.tensor([0, 1, 2], dtype=torch.int32)
    assert dispatch.attention_shape(q, torch.empty(2, 2, 8), cu, one, 3, 1, -1, -1, 0.0) is None  # one key


def test_attention_auto_sends_bf16_prefill_to_sdpa_only_without_lse(monkeypatch):
    """auto with the Intel table: a bf16 prefill without return_lse takes SDPA's forward, with
    return_lse the kernel; the two outputs agree within bf16's tolerance."""
    monkeypatch.delenv("TESSERA_DISPATCH", raising=False)
    monkeypatch.setattr(dispatch, "thresholds", lambda: dict(dispatch.DEFAULTS_INTEL))
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 48, h, 32, generator=g).to(torch.bfloat16) for h in (4, 2, 2))
    before = dict(dispatch.counts)
    out = tessera.attention(q, k, v, causal=True, backend="cpu")
    assert dispatch.counts.get(("attention", "vendor"), 0) == before.get(("attention", "vendor"), 0) + 1
    out2, lse = tessera.attention(q, k, v, causal=True, return_lse=True, backend="cpu")
    assert dispatch.counts.get(("attention", "vendor"), 0) == before.get(("attention", "vendor"), 0) + 1
    torch.testing.assert_close(out.float(), out2.float(), rtol=2e-2, atol=2e-2)
    # training at 48 tokens: SDPA's forward, the kernel's backward on SDPA's lse (backward from 1024)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dy = torch.randn(out.shape, generator=g).to(torch.bfloat16)
    got = torch.autograd.grad(tessera.attention(*leaves, causal=True, backend="cpu"), leaves, dy)
    assert dispatch.counts.get(("attention_bwd", "kernel"), 0) > before.get(("attention_bwd", "kernel"), 0)
    with dispatch.forced("kernel"):
        want = torch.autograd.grad(tessera.attention(*leaves, causal=True, backend="cpu"), leaves, dy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
