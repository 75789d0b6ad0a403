"""The integer-only pipeline: requantize, linear_int8_requant, conv2d_int8.

* golden vectors (tests/golden/requant/vectors.json, written by tests/golden/gen_requant.py in plain
  Python integers, independent of tessera and torch): every backend bit for bit, including
  rounding ties of both signs, int32 saturation, multiplier 2^31 - 1 / INT32_MIN, shifts -31..30
  and the int64 (int16-activation) path;
* the CPU build with and without AVX512-VNNI (the int8 GEMM under linear / conv);
* bad inputs (ranges of shift / qmin / qmax / zero point, dtypes) raise clear errors;
* hypothesis fuzz of shapes, layouts and options against the reference (spec.fuzz).
The op-contract matrix (tests/test_matrix.py) runs every spec case on every backend as well.
"""
from __future__ import annotations

import json
from unittest import mock
from pathlib import Path

import math

import pytest
import torch
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, backend_available
from tessera.testing.matrix import fuzz_spec

CPU = torch.device("cpu")
BACKENDS = [b for b in ("reference", "cpu", "triton", "opencl") if backend_available(b, CPU)[0]]
GOLDEN = json.loads((Path(__file__).parent / "golden" / "requant" / "vectors.json").read_text())


def test_golden_file_is_the_independent_generator_output(tmp_path, monkeypatch):
    """vectors.json is byte for byte what tests/golden/gen_requant.py (numpy, formulas written out;
    no tessera, no torch) writes now: never tessera's own earlier output."""
    import importlib.util
    src = Path(__file__).parent / "golden"
    spec = importlib.util.spec_from_file_location("gen_requant", src / "gen_requant.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert "tessera" not in gen.__dict__ and "torch" not in gen.__dict__
    (tmp_path / "requant").mkdir()
    monkeypatch.setattr(gen, "HERE", tmp_path)
    gen.main()
    assert (tmp_path / "requant" / "vectors.json").read_bytes() == (src / "requant" / "vectors.json").read_bytes()


def _t(v, dtype):
    return torch.tensor(v, dtype=dtype)


def _backends(op):
    return [b for b in BACKENDS if b in tessera.OPS[op].kernels]


@pytest.mark.parametrize("backend", _backends("requantize"))
def test_requantize_golden(backend):
    bad = []
    for i, v in enumerate(GOLDEN["requantize"]):
        acc = _t(v["acc"], getattr(torch, v["acc_dtype"]))
        y = tessera.requantize(acc, _t(v["multiplier"], torch.int32), _t(v["shift"], torch.int32), v["zero_point"],
                               v["qmin"], v["qmax"], rounding=v["rounding"], out_dtype=getattr(torch, v["out_dtype"]),
                               backend=backend)
        assert y.dtype == getattr(torch, v["out_dtype"]) and y.shape == acc.shape
        exp = _t(v["out"], torch.int64)
        if not torch.equal(y.long(), exp):
            bad.append(f"vector {i} ({v['rounding']}, m={v['multiplier'][:2]}, s={v['shift'][:2]}): "
                       f"{int((y.long() != exp).sum())} elements differ")
    assert not bad, "\n".join(bad)


def test_requantize_rounding_rules():
    """The documented tie rules, on hand-computed values (multiplier 2^30 = 0.5, shift -1: acc / 4):
    SRDHM rounds ties up (its negative nudge is 1 - 2^30, not -2^30: -2.5 -> -2), RDBPOT rounds
    ties away from zero, single rounding rounds ties up."""
    acc = _t([[2, -2, 6, -6, 10, -10]], torch.int32)
    m, s = _t(2**30, torch.int32), _t(-1, torch.int32)
    # exact acc/4: 0.5, -0.5, 1.5, -1.5, 2.5, -2.5.  double: SRDHM(acc, 0.5) = acc/2 (exact for
    # even acc), then RDBPOT by 1: half away from zero
    assert tessera.requantize(acc, m, s, backend="reference").tolist() == [[1, -1, 2, -2, 3, -3]]
    assert tessera.requantize(acc, m, s, rounding="single", backend="reference").tolist() == [[1, 0, 2, -1, 3, -2]]
    # double rounding differs from single rounding: acc = 3, m = 0.5, shift -1: 3/4 = 0.75
    # SRDHM(3, 0.5) = 1.5 -> 2 (away from zero), then 2 / 2 = 1 (single: round(0.75) = 1 too);
    # acc = 5: 5/4 = 1.25; SRDHM -> 2.5 -> 3, RDBPOT 3 / 2 = 1.5 -> 2 (single: 1): the double-rounding
    # artefact; acc = -5: SRDHM -2.5 -> -2 (tie up), RDBPOT -2 / 2 = -1 (single: -1.25 -> -1)
    acc = _t([[5, -5]], torch.int32)
    assert tessera.requantize(acc, m, s, backend="reference").tolist() == [[2, -1]]
    assert tessera.requantize(acc, m, s, rounding="single", backend="reference").tolist() == [[1, -1]]
    for b in _backends("requantize"):
        for r in ("double", "single"):
            assert torch.equal(tessera.requantize(acc, m, s, rounding=r, backend=b),
                               tessera.requantize(acc, m, s, rounding=r, backend="reference"))


def test_requantize_out_dtype_rules():
    acc = torch.randint(-2**20, 2**20, (3, 5), dtype=torch.int32)
    m, s = _t(2**30, torch.int32), _t(-8, torch.int32)
    assert tessera.requantize(acc, m, s).dtype == torch.int8
    assert tessera.requantize(acc, m, s, qmin=-1000, qmax=1000).dtype == torch.int16
    assert tessera.requantize(acc, m, s, out_dtype=torch.int16).dtype == torch.int16
    relu = tessera.requantize(acc, m, s, -3, -3, 127)
    assert int(relu.min()) >= -3


@pytest.mark.parametrize("change,exc,needle", [
    ({"shift": _t([31], torch.int32)}, ValueError, "'shift'.*-31, 30"),
    ({"shift": _t([-32], torch.int32)}, ValueError, "'shift'"),
    ({"shift": _t([1, 2], torch.int32)}, ValueError, "'shift'.*1 value"),
    ({"multiplier": _t([1], torch.int64)}, TypeError, "'multiplier'.*int32"),
    ({"acc": _t([[1.0]], torch.float32)}, TypeError, "'acc'"),
    ({"qmin": 5, "qmax": 4}, ValueError, "qmin=5, qmax=4"),
    ({"qmin": -200, "out_dtype": torch.int8}, ValueError, "qmin"),
    ({"zero_point": 300}, ValueError, "'zero_point'"),
    ({"zero_point": 1.5}, TypeError, "'zero_point'"),
    ({"rounding": "nearest"}, ValueError, "'rounding'"),
    ({"out_dtype": torch.int32}, TypeError, "'out_dtype'"),
])
def test_requantize_bad_input(change, exc, needle):
    kw = {"acc": _t([[1, 2, 3]], torch.int32), "multiplier": _t([2**30], torch.int32),
          "shift": _t([-1], torch.int32)}
    kw.update(change)
    with pytest.raises(exc, match=needle):
        tessera.requantize(**kw, backend="cpu")


def test_requantize_int64_rules():
    acc = _t([[2**40, -2**40]], torch.int64)
    with pytest.raises(ValueError, match="'shift'.*-31, 7"):
        tessera.requantize(acc, _t([2**30], torch.int32), _t([8], torch.int32))
    with pytest.raises(ValueError, match="'rounding'.*int64"):
        tessera.requantize(acc, _t([2**30], torch.int32), _t([0], torch.int32), rounding="double")


# ---------------------------------------------------------------- hypothesis fuzz (spec.fuzz)

@st.composite
def _requant_inputs(draw):
    M = draw(st.integers(0, 30))
    Cn = draw(st.integers(1, 300))
    acc64 = draw(st.booleans())
    rounding = "single" if acc64 else draw(st.sampled_from(["double", "single"]))
    per_ch = draw(st.booleans())
    rowslice = draw(st.booleans())
    out_dtype = draw(st.sampled_from([torch.int8, torch.int16]))
    zp = draw(st.integers(-100, 100))
    lo, hi = (-128, 127) if out_dtype == torch.int8 else (-32768, 32767)
    qmin = draw(st.integers(lo, hi))
    qmax = draw(st.integers(qmin, hi))

    def mk(dtype, device, gen):
        n = Cn if per_ch else 1
        if acc64:
            acc = torch.randint(-2**50, 2**50, (M, Cn + 2), generator=gen, dtype=torch.int64)
            shift = torch.randint(-31, 8, (n,), generator=gen, dtype=torch.int32)
        else:
            acc = torch.randint(-2**31, 2**31, (M, Cn + 2), generator=gen, dtype=torch.int64).to(torch.int32)
            shift = torch.randint(-31, 31, (n,), generator=gen, dtype=torch.int32)
        acc = acc[:, 1:Cn + 1] if rowslice else acc[:, :Cn].contiguous()
        mult = torch.randint(-2**31, 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        return {"acc": acc, "multiplier": mult, "shift": shift, "zero_point": max(lo, min(hi, zp)),
                "qmin": qmin, "qmax": qmax, "rounding": rounding, "out_dtype": out_dtype}
    return out_dtype, Case(f"fuzz-{M}x{Cn}-{rounding}-{acc64}-{per_ch}", mk)


@pytest.mark.fuzz
@pytest.mark.parametrize("backend", [b for b in _backends("requantize") if b != "reference"])
def test_fuzz_requantize_vs_reference(backend):
    fuzz_spec("requantize", backend, _requant_inputs())


# ---------------------------------------------------------------- linear_int8_requant / conv2d_int8

@pytest.fixture(params=["vnni", "portable"])
def gemm_path(request, monkeypatch):
    """The CPU int8 GEMM under linear / conv, with and without AVX512-VNNI (bit-exact both)."""
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if request.param == "vnni" and not qcpu.has_vnni():
        pytest.skip("this CPU/ISA level has no AVX512-VNNI (the portable path is tested)")
    monkeypatch.setenv("TESSERA_QI8_VNNI", "1" if request.param == "vnni" else "0")
    return request.param


@pytest.mark.parametrize("backend", _backends("linear_int8_requant"))
def test_linear_int8_requant_golden(backend, gemm_path):
    for i, v in enumerate(GOLDEN["linear"]):
        y = tessera.linear_int8_requant(_t(v["x"], torch.int8), v["x_zero_point"], _t(v["weight"], torch.int8),
                                        _t(v["bias"], torch.int32), _t(v["multiplier"], torch.int32),
                                        _t(v["shift"], torch.int32), v["out_zero_point"], v["qmin"], v["qmax"],
                                        backend=backend)
        assert y.dtype == torch.int8
        assert torch.equal(y.long(), _t(v["out"], torch.int64)), f"vector {i}"


def test_linear_int8_requant_bad_input():
    x = torch.zeros(2, 8, dtype=torch.int8)
    w = torch.zeros(3, 8, dtype=torch.int8)
    m, s = _t([2**30], torch.int32), _t([-3], torch.int32)
    with pytest.raises(ValueError, match="'weight'.*K = 8"):
        tessera.linear_int8_requant(x, 0, w[:, :5], None, m, s)
    with pytest.raises(TypeError, match="'bias'.*int32"):
        tessera.linear_int8_requant(x, 0, w, torch.zeros(3), m, s)
    with pytest.raises(ValueError, match="'x_zero_point'=200"):
        tessera.linear_int8_requant(x, 200, w, None, m, s)
    with pytest.raises(ValueError, match="'x_zero_point'.*symmetric"):
        tessera.linear_int8_requant(x.short(), 1, w, None, m, s)
    with pytest.raises(ValueError, match="'multiplier'.*3"):
        tessera.linear_int8_requant(x, 0, w, None, _t([1, 2], torch.int32), s)
    with pytest.raises(TypeError, match="'x'"):
        tessera.linear_int8_requant(x.float(), 0, w, None, m, s)


@pytest.mark.parametrize("backend", _backends("conv2d_int8"))
def test_conv2d_int8_golden(backend, gemm_path):
    for i, v in enumerate(GOLDEN["conv2d"]):
        xdt = getattr(torch, v["x_dtype"])
        x = _t(v["x"], xdt)
        bias = _t(v["bias"], torch.int32 if xdt == torch.int8 else torch.int64)
        for fmt in (torch.contiguous_format, torch.channels_last):
            y = tessera.conv2d_int8(x.contiguous(memory_format=fmt), v["x_zero_point"], _t(v["weight"], torch.int8),
                                    bias, _t(v["multiplier"], torch.int32), _t(v["shift"], torch.int32),
                                    v["out_zero_point"], v["stride"], v["padding"], v["dilation"], v["groups"],
                                    v["qmin"], v["qmax"], backend=backend)
            assert y.dtype == (torch.int8 if xdt == torch.int8 else torch.int16)
            assert torch.equal(y.long(), _t(v["out"], torch.int64)), f"vector {i} {fmt}"
            assert y.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("groups", [1, 2, 6])   # dense (im2col + GEMM), grouped, depthwise
def test_int8_weight_memo_follows_in_place_updates(groups):
    """The cpu kernels derive a permuted weight, its row sums and the offset bias - x_zp * sum w once
    per weight tensor (_library.per_tensor); an in-place update of the weight or the bias (version
    bump), a new bias tensor or another x_zp must not reuse them."""
    gen = torch.Generator().manual_seed(groups)
    x = torch.randint(-128, 128, (2, 6, 7, 9), generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, (6, 6 // groups, 3, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-1000, 1000, (6,), generator=gen, dtype=torch.int32)
    m, s = torch.full((6,), 2**30, dtype=torch.int32), torch.full((6,), -6, dtype=torch.int32)
    wl = w.reshape(6, -1).clone()
    xl = torch.randint(-128, 128, (5, wl.shape[1]), generator=gen, dtype=torch.int8)
    for step in range(3):
        for xz in (3, -7):                      # the offset follows x_zp and the bias on every call
            got = tessera.conv2d_int8(x, xz, w, b, m, s, 1, 1, 1, 1, groups, backend="cpu")
            want = tessera.conv2d_int8(x, xz, w, b, m, s, 1, 1, 1, 1, groups, backend="reference")
            assert torch.equal(got, want), (step, xz)
            got = tessera.linear_int8_requant(xl, xz, wl, b, m, s, 1, backend="cpu")
            assert torch.equal(got, tessera.linear_int8_requant(xl, xz, wl, b, m, s, 1, backend="reference"))
        b.add_(7)                               # the bias alone, in place: the cached offset must follow
        got = tessera.conv2d_int8(x, -7, w, b, m, s, 1, 1, 1, 1, groups, backend="cpu")
        assert torch.equal(got, tessera.conv2d_int8(x, -7, w, b, m, s, 1, 1, 1, 1, groups, backend="reference"))
        got = tessera.linear_int8_requant(xl, -7, wl, b, m, s, 1, backend="cpu")
        assert torch.equal(got, tessera.linear_int8_requant(xl, -7, wl, b, m, s, 1, backend="reference"))
        w.mul_(-1).add_(step)                   # in place: the memo must rebuild
        wl.copy_(w.reshape(6, -1))
        b = b + 5


@pytest.mark.parametrize("bias_mag", [1000, 2**31 - 1000, 2**31 - 1])
def test_depthwise_int8_offset_paths(bias_mag):
    """The depthwise paths by the size of the offset (bias - x_zp * sum w): small, tsr_dw_requant_k3's
    exact fp32 sums; past 2^24, tsr_dw_requant, which starts its int32 sums at the offset when no
    sum can overflow, else adds it saturating in int64 (biases near the int32 limit): all
    bit-exact, both layouts, both zp ends."""
    gen = torch.Generator().manual_seed(bias_mag % 1000)
    C = 70
    w = torch.randint(-128, 128, (C, 1, 3, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-bias_mag, bias_mag, (C,), generator=gen, dtype=torch.int64).to(torch.int32)
    m = torch.randint(2**29, 2**31 - 1, (C,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-20, 3, (C,), generator=gen, dtype=torch.int32)
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randint(-128, 128, (2, C, 6, 7), generator=gen, dtype=torch.int8).contiguous(memory_format=fmt)
        for zp in (-128, 127):
            got = tessera.conv2d_int8(x, zp, w, b, m, s, 0, 1, 1, 1, C, backend="cpu")
            assert torch.equal(got, tessera.conv2d_int8(x, zp, w, b, m, s, 0, 1, 1, 1, C, backend="reference"))


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 1, 1), (1, 0, (2, 1)), (2, 2, 1),
                                                     ((1, 2), (2, 0), (2, 1)), (1, 0, 2)])
@pytest.mark.parametrize("C,W,kh", [(1, 1, 3), (16, 7, 3), (70, 13, 3), (33, 17, 3), (130, 5, 2), (65, 6, 5)])
def test_depthwise_int8_k3_tiles(stride, padding, dilation, C, W, kh):
    """tsr_dw_requant_k3 (int8 x, 3-wide taps, horizontal stride 1 or 2: fp32 sums, requantized in
    registers) against the int64 reference: partial tiles (W < 8, 13, 17), channel tails (65, 130),
    kh x 3 windows (kh 2, 3, 5), padding rows and columns, vertical dilation, both roundings, int8
    and int16 outputs, per-channel and per-tensor scales, a fused ReLU's clamp; and the integer tap
    loop it replaces (forced) gives the same bits."""
    from tessera.ops._requant import cpu as rq
    gen = torch.Generator().manual_seed(C * 100 + W)
    w = torch.randint(-128, 128, (C, 1, kh, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-30000, 30000, (C,), generator=gen, dtype=torch.int32)
    pw = padding[1] if isinstance(padding, tuple) else padding
    W = W if pw else max(W, 5)   # no horizontal padding: at least one output column
    x = torch.randint(-128, 128, (2, C, 9, W), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    for per_ch, rounding, out_dtype in ((True, "double", torch.int8), (False, "single", torch.int16)):
        n = C if per_ch else 1
        m = torch.randint(2**30, 2**31 - 1, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        s = torch.randint(-12, 1, (n,), generator=gen, dtype=torch.int32)
        for zp in (-128, 5, 127):
            args = (x, zp, w, b, m, s, 3, stride, padding, dilation, C, 3 if zp == 5 else None)   # zp 5: ReLU
            kw = dict(rounding=rounding, out_dtype=out_dtype)
            want = tessera.conv2d_int8(*args, backend="reference", **kw)
            assert torch.equal(tessera.conv2d_int8(*args, backend="cpu", **kw), want)
            with mock.patch.object(rq, "_k3_available", lambda: False):
                assert torch.equal(tessera.conv2d_int8(*args, backend="cpu", **kw), want)


@pytest.mark.parametrize("C,W,k,stride", [(3, 1, 7, 2), (3, 2, 7, 1), (3, 9, 7, 2), (5, 4, 3, 1), (16, 13, 3, 2),
                                           (2, 6, 5, 3), (3, 11, 3, 2), (7, 5, 3, 1), (4, 8, 4, 1), (3, 24, 3, 2),
                                           (3, 17, 3, 1), (2, 20, 3, 1), (1, 9, 2, 1), (3, 30, 7, 2), (5, 23, 5, 1),
                                           (8, 21, 5, 2), (16, 12, 4, 1), (13, 15, 3, 1), (4, 19, 7, 1)])
@pytest.mark.parametrize("xdt", [torch.int8, torch.int16])
@pytest.mark.parametrize("fused", [False, True])
def test_im2col_tap_runs(C, W, k, stride, xdt, fused, monkeypatch):
    """tsr_im2col's one-copy-per-tap-row path (channels-last x, one group, dilation 1): runs cut by
    the padding at either end or both (W < k), rows of padding, against the int64 reference; column
    rows of at most 64 bytes (MobileNetV2's 27-byte stem, 63 and 64 bytes) are built in one register
    from masked loads, int8 and int16 codes; the interior's pixels (no tap column outside the image)
    two a register where two column rows fit, an odd count of them leaving one; interior column rows
    of 65..256 bytes (ResNet-18's 147-byte stem; 117, 125, 150, 196, 200, 250 and 256 bytes) in two to
    four registers, a tap row split across two of them.  fused: int8 rows made by the GEMM itself
    (qi8_im2col.h) wherever it takes them (else tsr_im2col, as for int16)."""
    from tessera.ops._requant import cpu as rq
    monkeypatch.setattr(rq, "FUSED_MIN_RUN", 1 if fused else 10**9)
    gen = torch.Generator().manual_seed(C * 31 + W)
    O = 8
    lo, hi = (-128, 128) if xdt == torch.int8 else (-32768, 32768)
    x = torch.randint(lo, hi, (2, C, 6, W), generator=gen, dtype=xdt).contiguous(
        memory_format=torch.channels_last)
    w = torch.randint(-128, 128, (O, C, k, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-1000, 1000, (O,), generator=gen, dtype=torch.int32 if xdt == torch.int8 else torch.int64)
    m = torch.randint(2**30, 2**31 - 1, (O,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-12, 1, (O,), generator=gen, dtype=torch.int32)
    for zp in ((-128, 9) if xdt == torch.int8 else (0,)):
        args = (x, zp, w, b, m, s, 2, stride, k // 2, 1, 1)
        assert torch.equal(tessera.conv2d_int8(*args, backend="cpu"), tessera.conv2d_int8(*args, backend="reference"))


@pytest.mark.parametrize("vnni", ["1", "2"])
def test_fused_im2col_rows_match_the_gathered_matrix(vnni, monkeypatch):
    """tsr_qi8_conv_rq (qi8_im2col.h) makes a conv's im2col rows chunk by chunk inside the GEMM:
    the same int8 output, bit for bit, as tsr_im2col's matrix through tsr_qi8_mm_rq and as the
    reference.  Dense pixels (one run a tap row, cut by the padding on either side or both) and
    strided pixels or dilated taps (a copy a tap); rows of at most 64 bytes built whole in a
    register; rows of padding; M across the 96-row chunks
    with a partial last one; K <= 128 (VNNI) and K > 128 or <= 64 (AMX tiles where the CPU has
    them, vnni "1"; their 64-byte padded rows) against VPDPBUSD only (vnni "2"); both roundings.
    Where the call would not take the broadcast GEMM (M <= 16) or x overlaps itself (a
    broadcast W), it returns False and writes nothing."""
    from tessera.ops._qlinear_int8.cpu import conv_requant, has_vnni, int_mm_requant
    from tessera.ops._requant import cpu as rq
    from tessera.ops.conv2d_int8 import _ref
    if not has_vnni():
        pytest.skip("no AVX512-VNNI here: tsr_qi8_conv_rq declines every call (the gathered matrix runs)")
    monkeypatch.setenv("TESSERA_QI8_VNNI", vnni)
    gen = torch.Generator().manual_seed(7)
    cases = [  # (N, C, H, W, O, (kh, kw), stride, padding, dilation, pixel step)
        (1, 16, 9, 11, 24, (3, 3), (1, 1), (1, 1), (1, 1), 1), (2, 32, 13, 13, 40, (3, 3), (2, 2), (1, 1), (1, 1), 1),
        (1, 64, 14, 14, 70, (3, 3), (1, 1), (1, 1), (1, 1), 1), (3, 17, 13, 5, 9, (3, 3), (1, 1), (2, 2), (2, 2), 1),
        (2, 48, 16, 16, 65, (5, 5), (2, 1), (2, 0), (1, 1), 1), (2, 6, 8, 3, 130, (3, 7), (1, 1), (0, 4), (1, 1), 1),
        (1, 16, 20, 20, 16, (1, 1), (1, 1), (0, 0), (1, 1), 2), (1, 24, 6, 30, 33, (1, 3), (1, 2), (0, 1), (1, 1), 3),
        (2, 20, 11, 9, 31, (3, 3), (1, 1), (1, 1), (1, 2), 1), (1, 3, 30, 30, 8, (7, 7), (2, 2), (3, 3), (1, 1), 1),
        # whole rows of <= 64 bytes in one register: MobileNetV2's 27-byte stem, 64 and 4 bytes
        (2, 3, 30, 30, 32, (3, 3), (2, 2), (1, 1), (1, 1), 1), (1, 4, 20, 20, 16, (4, 4), (1, 1), (2, 2), (1, 1), 1),
        (1, 1, 9, 40, 5, (2, 2), (1, 3), (1, 0), (1, 1), 1),
        # rows of <= 32 bytes four pixels at a time (ic_fours, VBMI): 4 tap rows (two zmm sources),
        # 1 channel at stride 2, a 3-channel stem whose image rows end mid-group
        (2, 2, 15, 21, 20, (4, 4), (1, 1), (2, 1), (1, 1), 1), (1, 1, 17, 37, 24, (3, 3), (2, 2), (1, 1), (1, 1), 1),
        (3, 3, 19, 45, 32, (3, 3), (2, 2), (1, 1), (1, 1), 1),
        # K <= 64 on AMX tiles K bytes wide (qa_narrow_u8), rows made a 16-row block ahead: two
        # panels (the second reads the chunk made for the first), a last chunk of 4 rows
        (1, 3, 24, 24, 70, (3, 3), (1, 1), (1, 1), (1, 1), 1), (1, 3, 10, 10, 40, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ]
    for N, C, H, W, O, (kh, kw), st, pd, dl, step in cases:
        x = torch.randint(-128, 128, (N, C, H, W * step), generator=gen, dtype=torch.int8).contiguous(
            memory_format=torch.channels_last)[..., ::step]
        w = torch.randint(-128, 128, (O, C, kh, kw), generator=gen, dtype=torch.int8)
        b = torch.randint(-5000, 5000, (O,), generator=gen, dtype=torch.int32)
        m = torch.randint(2**29, 2**31 - 1, (O,), generator=gen, dtype=torch.int64).to(torch.int32)
        s = torch.randint(-14, -8, (O,), generator=gen, dtype=torch.int32)
        Ho = (H + 2 * pd[0] - dl[0] * (kh - 1) - 1) // st[0] + 1
        Wo = (W + 2 * pd[1] - dl[1] * (kw - 1) - 1) // st[1] + 1
        w2 = w.permute(0, 2, 3, 1).reshape(O, -1).contiguous()
        for zp, rounding in ((-128, 0), (9, 1), (127, 0)):
            off = b.long() - zp * w2.sum(1, dtype=torch.int64)
            want = _ref(x, zp, w, b, m, s, -3, st, pd, dl, rounding=("double", "single")[rounding])
            want = want.permute(0, 2, 3, 1).reshape(-1, O)
            out = torch.full((N * Ho * Wo, O), 77, dtype=torch.int8)
            assert conv_requant(x, kh, kw, st, pd, dl, Ho, Wo, zp, w2, m, s, off, -3, -128, 127, rounding, out)
            assert torch.equal(out, want), (N, C, H, W, kh, kw, st, pd, dl, step, zp)
            cols = rq.im2col(x, kh, kw, st, pd, dl, Ho, Wo, zp, 1, 1)
            gathered = int_mm_requant(cols, w2, m, s, off, -3, -128, 127, rounding, torch.empty_like(out))
            assert torch.equal(gathered, out)
    # declined: M <= 16, and a broadcast W (stride 0 < C)
    x = torch.randint(-128, 128, (1, 16, 4, 4), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    w2 = torch.randint(-128, 128, (8, 9 * 16), generator=gen, dtype=torch.int8)
    m, s, off = torch.full((8,), 2**30, dtype=torch.int32), torch.full((8,), -10, dtype=torch.int32), torch.zeros(8, dtype=torch.int64)
    for xx in (x, x[..., :1].expand(1, 16, 4, 40)):
        Wo = xx.shape[3]
        out = torch.full((4 * Wo, 8), 77, dtype=torch.int8)
        taken = conv_requant(xx, 3, 3, (1, 1), (1, 1), (1, 1), 4, Wo, 0, w2, m, s, off, 0, -128, 127, 0, out)
        assert not taken and bool((out == 77).all())


@pytest.mark.parametrize("shape", [(1, 16, 4, 4), (2, 17, 3, 11), (1, 33, 16, 17), (3, 2, 1, 1), (1, 64, 9, 15)])
def test_int8_layout_copies(shape):
    """tsr_transpose_i8 (the conv's NCHW <-> channels-last copies): SSE2 16 x 16 blocks and the
    element-wise edges, every position distinct."""
    from tessera.ops._requant import cpu as rq
    x = (torch.arange(torch.Size(shape).numel()) % 251 - 125).to(torch.int8).reshape(shape)
    xc = rq._channels_last(x)
    assert xc.is_contiguous(memory_format=torch.channels_last) and torch.equal(xc, x)
    rows = x.permute(0, 2, 3, 1).reshape(-1, shape[1]).contiguous()
    y = rq.rows_to_nchw(rows, shape[0], shape[2], shape[3])
    assert y.is_contiguous() and torch.equal(y, x)


@pytest.mark.parametrize("M,K", [(130, 64), (200, 600), (7, 600)])
def test_fused_gemm_requantize_offset_fold(M, K):
    """tsr_qi8_mm_rq: the broadcast kernel folds the offset into its int32 correction only when no
    sum can overflow (|off| <= INT32_MAX - K 2^14), else adds it saturating; shifts > 0 take
    rq_v_double's left-shift branch.  Offsets on both sides of the bound, against the reference."""
    gen = torch.Generator().manual_seed(M + K)
    N = 70
    lim = 2**31 - 1 - K * 2**14
    x = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    m = torch.randint(2**29, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-20, 4, (N,), generator=gen, dtype=torch.int32)
    x[0], w[0], w[1] = 127, 127, -128                  # sums that overflow int32 with the extreme biases
    for b in (torch.randint(-lim, lim, (N,), generator=gen, dtype=torch.int64),                # foldable
              torch.randint(-2**31, 2**31 - 1, (N,), generator=gen, dtype=torch.int64)):      # not always
        b = b.to(torch.int32)
        b[0], b[1] = 2**31 - 1, -2**31
        for xz in (-128, 127):
            got = tessera.linear_int8_requant(x, xz, w, b, m, s, 5, backend="cpu")
            assert torch.equal(got, tessera.linear_int8_requant(x, xz, w, b, m, s, 5, backend="reference"))


@pytest.mark.parametrize("N", [17, 24, 32, 40, 64, 96])
@pytest.mark.parametrize("vnni", ["1", "2"])
def test_gemm_requantized_in_registers(monkeypatch, N, vnni):
    """A requantized int8 GEMM on the VNNI kernel requantizes straight from its accumulators where
    one K block covers K (qi8_outer_avx512.h: qn2_rq_block, 12 rows x 17-32 columns; qo_rq_block,
    6 rows x 33-64) and the rows % the block through the int32 tile: M across the 96-row chunks
    with a partial last block, K = 27 and 600 (one K block) and 1100 (several: the tile path),
    M = 12 (no broadcast GEMM), panels of 17-64 columns (96: one of each kernel), rows of 32 bytes
    (one store for two rows) or narrower, per-channel and per-tensor multipliers, offsets folded
    or not, accumulators on rounding ties (the integer fallback), shifts >= 0 (no f8 form: the tile
    path), x rows 2K apart, output rows N + 8 apart (nothing written past N), against the
    reference.  vnni "1" takes AMX tiles where the CPU has them, "2" the VNNI kernel."""
    from tessera.ops._qlinear_int8.cpu import has_vnni, int_mm_requant
    if not has_vnni():
        pytest.skip("no AVX512-VNNI here: the broadcast GEMM does not run")
    monkeypatch.setenv("TESSERA_QI8_VNNI", vnni)
    gen = torch.Generator().manual_seed(N)
    for M, K in ((12, 27), (131, 27), (203, 600), (150, 1100)):
        x = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
        w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
        x[1], w[0] = 0, 0                                  # zero sums: ties of bias / 2^e
        m = torch.randint(2**29, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
        m[0] = 2**30                                       # x 1/2: bias / 2^(e+1) ties
        s = torch.randint(-14, -6, (N,), generator=gen, dtype=torch.int32)
        b = torch.randint(-5000, 5000, (N,), generator=gen, dtype=torch.int32)
        b[0] = 3 * 2**10                                   # odd multiple of 2^(e-1) for e = 11
        s[0] = -11
        for bias, mm, ss, xz in ((b, m, s, -128), (None, m[:1], s[:1], 7), (b, m, s.abs() % 3, 0)):
            lin = (x, xz, w, bias, mm, ss, 3)
            want = tessera.linear_int8_requant(*lin, backend="reference")
            assert torch.equal(tessera.linear_int8_requant(*lin, backend="cpu"), want), (M, K, N, xz)
            xs = torch.cat([x, x], 1)[:, :K]                        # rows 2K apart
            assert torch.equal(tessera.linear_int8_requant(xs, *lin[1:], backend="cpu"),
                               tessera.linear_int8_requant(xs, *lin[1:], backend="reference"))
        # output rows N + 8 apart: nothing written past a row's N bytes
        off = b.long() + 128 * w.sum(1, dtype=torch.int64)
        big = torch.full((M, N + 8), 77, dtype=torch.int8)
        int_mm_requant(x, w, m, s, off, 3, -128, 127, 0, big[:, :N])
        want = tessera.linear_int8_requant(x, -128, w, b, m, s, 3, backend="reference")
        assert torch.equal(big[:, :N], want) and bool((big[:, N:] == 77).all()), (M, K, N)


@pytest.mark.parametrize("M,K,N", [(40, 129, 70), (57, 200, 64), (64, 1152, 130), (200, 576, 33)])
@pytest.mark.parametrize("vnni", ["1", "2"])
def test_a16w8_split_into_int8_halves(monkeypatch, M, K, N, vnni):
    """int16 x int8 requantized where the int8 rule takes AMX (K > 128, M >= 40; TESSERA_QI8_VNNI=1):
    two int8 GEMMs on the u8 halves lo and hi + 128 of each code (split16_gemm), combined in int64
    as 256 hi + (lo - 128) + 128 colsum; =2 keeps VPDPWSSD.  Codes at both int16 ends, odd K (a
    padded last group), rows off the 16-row tiles, partial panels, the stored weight panels too
    (conv2d_int8), against the reference."""
    monkeypatch.setenv("TESSERA_QI8_VNNI", vnni)
    gen = torch.Generator().manual_seed(M + K + N)
    x = torch.randint(-32768, 32768, (M, K), generator=gen, dtype=torch.int16)
    x[0, :] = -32768
    x[1, :] = 32767
    w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    w[:, 0] = -128
    bias = torch.randint(-(1 << 24), 1 << 24, (N,), generator=gen, dtype=torch.int64)
    m = torch.randint(2**30, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
    e = round(math.log2(math.sqrt(K) * 32768 * 74)) - 13   # a typical |acc| lands near 2^13: most outputs in range
    s = torch.randint(-e - 1, -e + 2, (N,), generator=gen, dtype=torch.int32)
    for b, per_ch in ((bias, True), (None, False)):
        mm, ss = (m, s) if per_ch else (m[:1], s[:1])
        lin = (x, 0, w, b, mm, ss, 0, -32768, 32767)
        assert torch.equal(tessera.linear_int8_requant(*lin, out_dtype=torch.int16, backend="cpu"),
                           tessera.linear_int8_requant(*lin, out_dtype=torch.int16, backend="reference"))
    xc = x[:, :K - K % 2].reshape(1, M, 1, -1).permute(0, 3, 1, 2)   # channels-last 1x1 conv rows
    wc = w[:, :K - K % 2].reshape(N, -1, 1, 1).contiguous()
    conv = (xc, 0, wc, bias, m, s, 0)
    assert torch.equal(tessera.conv2d_int8(*conv, backend="cpu"), tessera.conv2d_int8(*conv, backend="reference"))


@pytest.mark.parametrize("M,K,N", [(40, 32, 192), (100, 27, 16), (17, 300, 70), (64, 200, 70)])
def test_packed_weight_cache(M, K, N):
    """linear_int8_requant / conv2d_int8 read the broadcast GEMM's weight panels packed once per
    weight tensor (tsr_qi8_pack, _library.per_tensor; K rounded up to 64 with zero groups: the
    VNNI kernel reads ceil(K / 4) groups at that panel stride, the AMX tiles all of them -- M = 64,
    K = 200 runs on AMX where the CPU has it); an update in place, and another weight tensor, must
    rebuild them: every call against the reference."""
    gen = torch.Generator().manual_seed(M + K + N)
    x = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    m = torch.randint(2**30, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.full((N,), -9, dtype=torch.int32)
    xc = x.reshape(1, M, 1, K).permute(0, 3, 1, 2)   # channels-last [1, K, M, 1]: the pointwise conv's rows are x
    for step in range(3):
        lin = (x, 3, w, None, m, s, -2, -128, 127)
        assert torch.equal(tessera.linear_int8_requant(*lin, backend="cpu"),
                           tessera.linear_int8_requant(*lin, backend="reference")), step
        conv = (xc, 3, w.reshape(N, K, 1, 1), None, m, s, -2)
        assert torch.equal(tessera.conv2d_int8(*conv, backend="cpu"), tessera.conv2d_int8(*conv, backend="reference"))
        if step == 0:
            w.neg_().add_(1)   # in place: the version counter moves
        else:
            w = w.flip(0).contiguous()   # another tensor


@pytest.mark.parametrize("M,K,N", [(200, 16, 96), (130, 27, 33), (97, 3, 70), (64, 130, 16)])
def test_fused_gemm_requantize_small_k_paths(M, K, N):
    """The broadcast kernel's small-K paths (tsr_qi8_mm_rq): activation rows copied at a stride of
    K rounded up to 4 (one flat pass for contiguous rows, masked steps for strided ones), and the
    tile requantization with its per-channel part formed once per 16 columns (rq_tile_v_double):
    per-channel and per-tensor scales, an INT32_MIN multiplier and positive shifts (its two
    rarely-taken branches), int8 and int16 outputs, against the reference."""
    gen = torch.Generator().manual_seed(M * K + N)
    base = torch.randint(-128, 128, (M, K + 5), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    b = torch.randint(-2**20, 2**20, (N,), generator=gen, dtype=torch.int32)
    m = torch.randint(2**29, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-16, -4, (N,), generator=gen, dtype=torch.int32)
    m[0], s[1] = -2**31, 2                        # INT32_MIN, and a left shift
    b[0], b[3] = -2**31, 2**31 - 1                # saturated accumulators: a = m = INT32_MIN (a * m = 2^62)
    for x in (base[:, :K].contiguous(), base[:, 2:K + 2]):        # contiguous rows, then a row stride K + 5
        for mult, shift in ((m, s), (m[2:3], s[2:3])):             # per channel, per tensor
            for out_dtype, qmin, qmax in ((torch.int8, -100, 120), (torch.int16, -3000, 30000)):
                args = (x, -7, w, b, mult, shift, 9, qmin, qmax)
                got = tessera.linear_int8_requant(*args, out_dtype=out_dtype, backend="cpu")
                want = tessera.linear_int8_requant(*args, out_dtype=out_dtype, backend="reference")
                assert torch.equal(got, want), (x.stride(), mult.numel(), out_dtype)


@pytest.mark.parametrize("M,K,N", [(200, 16, 96), (130, 27, 33), (64, 256, 16), (300, 577, 40), (50, 1152, 70)])
def test_a16w8_broadcast_gemm(M, K, N):
    """tsr_qi8_mm_rq's int16 x int8 broadcast kernel (VPDPWSSD on int16 pairs, panels widened by a
    gather or, past the last full pair, bytewise): exact int32 blocks of 256 K added in int64, at
    the extremes too (every product 2^22: one block of 256 sums to 2^30, K = 1152 to 2^32.2), odd
    K, per-channel and per-tensor scales, contiguous and strided rows, against the reference."""
    gen = torch.Generator().manual_seed(M * K + N)
    inside = []
    for extreme in (False, True):
        base = torch.randint(-32768, 32768, (M, K + 3), generator=gen, dtype=torch.int32).to(torch.int16)
        w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
        if extreme:
            base.fill_(-32768)
            w.fill_(-128)
        b = torch.randint(-2**24, 2**24, (N,), generator=gen, dtype=torch.int64)
        b[0] = 2**40                                 # the int64 bias path
        m = torch.randint(2**29, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
        # |acc| ~ 2^25 (random) to 2^32 (extreme): shifts that keep most outputs inside the clamp
        s = torch.randint(-24, -9, (N,), generator=gen, dtype=torch.int32)
        for x in (base[:, :K].contiguous(), base[:, 1:K + 1]):
            for mult, shift in ((m, s), (m[:1], s[:1])):
                args = (x, 0, w, b, mult, shift, 5, -30000, 30000)
                got = tessera.linear_int8_requant(*args, backend="cpu")
                assert torch.equal(got, tessera.linear_int8_requant(*args, backend="reference")), \
                    (extreme, x.stride(), mult.numel())
                inside.append(float(got.abs().lt(30000).float().mean()))
    assert sum(inside) / len(inside) > 0.2   # most outputs are not clamped: the sums are seen


def test_conv2d_int8_bad_input():
    x = torch.zeros(1, 4, 5, 5, dtype=torch.int8)
    w = torch.zeros(6, 2, 3, 3, dtype=torch.int8)
    m, s = _t([2**30], torch.int32), _t([-3], torch.int32)
    with pytest.raises(ValueError, match="'weight'.*groups = 1"):
        tessera.conv2d_int8(x, 0, w, None, m, s)
    with pytest.raises(ValueError, match="'x'.*smaller"):
        tessera.conv2d_int8(x[:, :, :2, :2], 0, w, None, m, s, groups=2)
    with pytest.raises(ValueError, match="'stride'"):
        tessera.conv2d_int8(x, 0, w, None, m, s, stride=0, groups=2)
    with pytest.raises(ValueError, match="'same'"):
        tessera.conv2d_int8(x, 0, w, None, m, s, padding="same", stride=2, groups=2)
    with pytest.raises(TypeError, match="'bias'.*int64"):
        tessera.conv2d_int8(x.short(), 0, w, torch.zeros(6, dtype=torch.int32), m, s, groups=2)
    with pytest.raises(ValueError, match="'x'.*4-D"):
        tessera.conv2d_int8(x[0], 0, w, None, m, s, groups=2)
    y = tessera.conv2d_int8(x, 0, w, None, m, s, padding="same", groups=2)
    assert y.shape == (1, 6, 5, 5)


@st.composite
def _conv_inputs(draw):
    from tessera.ops.conv2d_int8.spec import conv_case
    g = draw(st.sampled_from([1, 2, 3]))
    C = g * draw(st.integers(1, 4))
    O = g * draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    d = draw(st.integers(1, 2))
    H = draw(st.integers(d * (k - 1) + 1, 9))
    W = draw(st.integers(d * (k - 1) + 1, 9))
    layout = draw(st.sampled_from(["contig", "channels_last", "strided"]))
    dtype = draw(st.sampled_from([torch.int8, torch.int16]))
    case = conv_case(f"fuzz-{C}x{H}x{W}-o{O}-k{k}-g{g}-d{d}-{layout}", draw(st.integers(0, 2)), C, H, W, O, k,
                     stride=draw(st.integers(1, 3)), padding=draw(st.integers(0, 2)), dilation=d, groups=g,
                     layout=layout, per_channel=draw(st.booleans()), bias=draw(st.booleans()),
                     relu=draw(st.booleans()))
    return dtype, case


@st.composite
def _linear_inputs(draw):
    from tessera.ops.linear_int8_requant import _case
    M, K, N = draw(st.integers(0, 20)), draw(st.integers(1, 300)), draw(st.integers(1, 40))
    case = _case(f"fuzz-{M}x{K}-n{N}", (M,), K, N, per_channel=draw(st.booleans()),
                 layout=draw(st.sampled_from(["contig", "rowslice", "transposed"])), bias=draw(st.booleans()),
                 relu=draw(st.booleans()))
    return draw(st.sampled_from([torch.int8, torch.int16])), case


@pytest.mark.fuzz
@pytest.mark.parametrize("op,inputs", [("conv2d_int8", _conv_inputs), ("linear_int8_requant", _linear_inputs)])
def test_fuzz_int_pipeline_vs_reference(op, inputs):
    """The compiled CPU kernels (im2col, VNNI GEMM, requant.c) against the int64 reference."""
    fuzz_spec(op, "cpu", inputs())
