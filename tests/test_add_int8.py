"""tessera.add_int8 (TFLite's quantized ADD) and its parameters.

* golden vectors (tests/golden/requant/vectors.json "add", written by tests/golden/gen_requant.py in
  plain Python integers): every backend bit for bit -- every int8 code, ties, the largest and a
  negative multiplier, left shifts inside the MBQM, a saturating int32 sum, a fused ReLU, int16;
* tessera.quant.add_int8_params against the generator's own TFLite Prepare;
* the output layout, broadcasting, views, the vector / saturating paths and threads;
* bad inputs raise errors naming the argument;
* hypothesis fuzz against the reference (spec.fuzz).
The op-contract matrix (tests/test_matrix.py) runs the spec's cases on every backend as well.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, backend_available
from tessera.ops.add_int8 import add_int8_ref
from tessera.ops.add_int8.ref import _scaled
from tessera.testing.matrix import fuzz_spec

CPU = torch.device("cpu")
BACKENDS = [b for b in ("reference", "cpu", "triton") if backend_available(b, CPU)[0]]
GOLDEN = json.loads((Path(__file__).parent / "golden" / "requant" / "vectors.json").read_text())["add"]
PARAMS = ("a_zero_point", "a_multiplier", "a_shift", "b_zero_point", "b_multiplier", "b_shift", "out_multiplier",
          "out_shift", "out_zero_point", "qmin", "qmax")


def _call(a, b, p, **kw):
    return tessera.add_int8(a, p["a_zero_point"], p["a_multiplier"], p["a_shift"], b, p["b_zero_point"],
                            p["b_multiplier"], p["b_shift"], p["out_multiplier"], p["out_shift"], p["out_zero_point"],
                            p.get("qmin"), p.get("qmax"), left_shift=p.get("left_shift"), **kw)


@pytest.fixture(params=["table", "lanes"])
def cpu_path(request, monkeypatch):
    """The CPU kernel's int8 paths: VBMI table lookups (where the CPU has them) and the 16-lane loop."""
    monkeypatch.setenv("TESSERA_ADD_INT8_TABLE", "1" if request.param == "table" else "0")
    return request.param


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_int8_golden(backend, cpu_path):
    bad = []
    for i, v in enumerate(GOLDEN):
        dt = getattr(torch, v["dtype"])
        y = _call(torch.tensor(v["a"], dtype=dt), torch.tensor(v["b"], dtype=dt), v, backend=backend)
        assert y.dtype == dt
        exp = torch.tensor(v["out"])
        if not torch.equal(y.long(), exp):
            bad.append(f"vector {i} ({v['dtype']}, L={v['left_shift']}): {int((y.long() != exp).sum())} differ")
    assert not bad, "\n".join(bad)


def test_add_int8_params_match_tflite_prepare():
    """The helper derives what the generator's TFLite Prepare (written out independently) does."""
    n = 0
    for v in GOLDEN:
        if v["scales"] is None:
            continue
        p = tessera.quant.add_int8_params(*v["scales"], dtype=getattr(torch, v["dtype"]))
        assert p == {k: v[k] for k in p}, (v["scales"], p)
        n += 1
    assert n >= 4
    # the real scales they stand for: s_a / (2 max) = 0.5 for the larger operand
    p = tessera.quant.add_int8_params(0.1, 0.05, 0.2)
    assert (p["a_multiplier"], p["a_shift"]) == (2**30, 0) and p["left_shift"] == 20
    assert abs(p["b_multiplier"] * 2.0 ** (p["b_shift"] - 31) - 0.25) < 1e-9


def _params(gen, dt, **over):
    r = lambda lo, hi: int(torch.randint(lo, hi, (), generator=gen))   # noqa: E731
    L = 20 if dt == torch.int8 else 15
    zp = (lambda: r(-100, 100)) if dt == torch.int8 else (lambda: 0)
    p = {"a_zero_point": zp(), "a_multiplier": r(2**30, 2**31), "a_shift": r(-3, 1), "b_zero_point": zp(),
         "b_multiplier": r(2**30, 2**31), "b_shift": r(-3, 1), "out_multiplier": r(2**30, 2**31),
         "out_shift": -r(L - 1, L + 2), "out_zero_point": zp()}
    p.update(over)
    return p


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])
def test_add_int8_layouts(backend):
    """Channels-last in -> channels-last out; broadcasting either way; strided and expanded views."""
    gen = torch.Generator().manual_seed(3)
    p = _params(gen, torch.int8)
    x = torch.randint(-128, 128, (2, 6, 5, 7), generator=gen, dtype=torch.int8)
    xc = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(-128, 128, (2, 6, 5, 7), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    out = _call(xc, y, p, backend=backend)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    assert torch.equal(out, add_int8_ref(xc, p["a_zero_point"], p["a_multiplier"], p["a_shift"], y,
                                         p["b_zero_point"], p["b_multiplier"], p["b_shift"], p["out_multiplier"],
                                         p["out_shift"], p["out_zero_point"]))
    # NCHW a with channels-last b, b broadcast from a per-channel vector, a broadcast from b, a view
    for a, b in ((x, y), (x, y[0, :, :1, :1]), (x[:1], y), (x[:, ::2], y[:, 1::2]), (x.transpose(2, 3), y.mT)):
        got = _call(a, b, p, backend=backend)
        exp = add_int8_ref(a, p["a_zero_point"], p["a_multiplier"], p["a_shift"], b, p["b_zero_point"],
                           p["b_multiplier"], p["b_shift"], p["out_multiplier"], p["out_shift"], p["out_zero_point"])
        assert got.shape == exp.shape and torch.equal(got, exp)
        assert got.is_contiguous() or got.is_contiguous(memory_format=torch.channels_last)


def test_add_int8_every_code_pair(cpu_path):
    """All but two of the 65536 (a, b) int8 code pairs, in a channels-last map with a ragged tail (65534 = 64 k + 62), for
    TFLite-derived, extreme (negative, saturating) and relu-clamped parameters, against the reference."""
    codes = torch.arange(-128, 128, dtype=torch.int8)
    a = codes.repeat_interleave(256)[:65534].view(1, 7, 31, 302).contiguous(memory_format=torch.channels_last)
    b = codes.repeat(256)[:65534].view(1, 7, 31, 302).contiguous(memory_format=torch.channels_last)
    sets = [{**tessera.quant.add_int8_params(0.07, 0.02, 0.05), "a_zero_point": -9, "b_zero_point": 100,
             "out_zero_point": -3},
            {"a_zero_point": 127, "a_multiplier": 2**31 - 1, "a_shift": 1, "b_zero_point": -128,
             "b_multiplier": -2**31, "b_shift": 2, "out_multiplier": 2**30 + 7, "out_shift": -21,
             "out_zero_point": 11, "left_shift": 23},
            {**tessera.quant.add_int8_params(0.1, 0.1, 0.3), "a_zero_point": 0, "b_zero_point": 0,
             "out_zero_point": -128, "qmin": -100, "qmax": 90}]
    for p in sets:
        got = _call(a, b, p, backend="cpu")
        assert torch.equal(got, _call(a, b, p, backend="reference")), p


@pytest.mark.parametrize("dt", [torch.int8, torch.int16])
def test_add_int8_cpu_threads_and_saturating_sum(dt):
    """A call over the parallel threshold (two threads, blocks of 4096 with a ragged tail), once with
    TFLite-sized multipliers (the plain int32 sum) and once with left shifts in the input MBQMs that
    saturate it (the checked sum), against the reference."""
    gen = torch.Generator().manual_seed(5)
    lo, hi = (-128, 127) if dt == torch.int8 else (-32768, 32767)
    a = torch.randint(lo, hi + 1, (70001,), generator=gen, dtype=dt)
    b = torch.randint(lo, hi + 1, (70001,), generator=gen, dtype=dt)
    for over in ({}, {"a_shift": 4, "b_shift": 4, "a_multiplier": 2**31 - 1, "b_multiplier": 2**31 - 1,
                     "a_zero_point": 0, "b_zero_point": 0, "out_shift": -28}):
        p = _params(gen, dt, **over)
        old = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            got = _call(a, b, p, backend="cpu")
        finally:
            torch.set_num_threads(old)
        exp = _call(a, b, p, backend="reference")
        assert torch.equal(got, exp)
        if over:   # the saturated sums really occur, and at both signs
            ra = _scaled(a, p["a_zero_point"], p["a_multiplier"], p["a_shift"], 20 if dt == torch.int8 else 15)
            rb = _scaled(b, p["b_zero_point"], p["b_multiplier"], p["b_shift"], 20 if dt == torch.int8 else 15)
            assert int((ra + rb > 2**31 - 1).sum()) > 100 and int((ra + rb < -2**31).sum()) > 100


def test_add_int8_errors():
    x = torch.zeros(4, dtype=torch.int8)
    p = _params(torch.Generator().manual_seed(0), torch.int8)
    with pytest.raises(TypeError, match="'b'.*same dtype"):
        _call(x, x.short(), p)
    with pytest.raises(TypeError, match="'a'.*unsupported dtype"):
        _call(x.float(), x, p)
    with pytest.raises(ValueError, match="'a'.*'b'.*broadcast"):
        _call(x, torch.zeros(3, dtype=torch.int8), p)
    with pytest.raises(ValueError, match="'a_zero_point'=200"):
        _call(x, x, {**p, "a_zero_point": 200})
    with pytest.raises(ValueError, match="'out_multiplier'"):
        _call(x, x, {**p, "out_multiplier": 2**31})
    with pytest.raises(ValueError, match="'b_shift'=31"):
        _call(x, x, {**p, "b_shift": 31})
    with pytest.raises(ValueError, match="qmin=5, qmax=4"):
        _call(x, x, {**p, "qmin": 5, "qmax": 4})
    with pytest.raises(ValueError, match="'left_shift'=24 overflows int32"):
        _call(x, x, {**p, "left_shift": 24})
    with pytest.raises(ValueError, match="'left_shift'=16 overflows int32.*zero points 3, 0"):
        _call(x.short(), x.short(), {**p, "a_zero_point": 3, "b_zero_point": 0, "left_shift": 16})
    with pytest.raises(TypeError, match="'a_shift' must be an int"):
        _call(x, x, {**p, "a_shift": 1.0})
    with pytest.raises(TypeError, match="'dtype'"):
        tessera.quant.add_int8_params(0.1, 0.1, 0.1, dtype=torch.float32)
    with pytest.raises(ValueError, match="finite and > 0"):
        tessera.quant.add_int8_params(0.1, -1.0, 0.1)


# ---------------------------------------------------------------- hypothesis fuzz (spec.fuzz)

@st.composite
def _add_inputs(draw):
    dt = draw(st.sampled_from([torch.int8, torch.int16]))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=4)))
    bshape = tuple(s if draw(st.booleans()) else 1 for s in shape)[draw(st.integers(0, len(shape) - 1)):]
    lo, hi = (-128, 127) if dt == torch.int8 else (-32768, 32767)
    left = draw(st.integers(0, 23 if dt == torch.int8 else 15))
    m = st.integers(-2**31, 2**31 - 1)
    s = st.integers(-31, 30)
    zp = st.integers(-128, 127) if dt == torch.int8 else st.just(0)
    p = {"a_zero_point": draw(zp), "a_multiplier": draw(m), "a_shift": draw(s), "b_zero_point": draw(zp),
         "b_multiplier": draw(m), "b_shift": draw(s), "out_multiplier": draw(m), "out_shift": draw(s),
         "out_zero_point": draw(zp), "left_shift": left}
    qmin = draw(st.integers(lo, hi))
    p.update(qmin=qmin, qmax=draw(st.integers(qmin, hi)))
    swap = draw(st.booleans())

    def mk(dtype, device, gen):
        a = torch.randint(lo, hi + 1, shape, generator=gen, dtype=dt)
        b = torch.randint(lo, hi + 1, bshape, generator=gen, dtype=dt)
        if swap:
            a, b = b, a
        return {"a": a, "b": b, **p}
    return dt, Case(f"fuzz-{shape}-{bshape}-{dt}", mk)


@pytest.mark.fuzz
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])
def test_fuzz_add_int8_vs_reference(backend):
    fuzz_spec("add_int8", backend, _add_inputs())
