"""Quantised formats: golden vectors on every backend, the contract, packing and converters.

* ``tests/golden/*.json`` (written by ``tests/golden/make_golden.py`` from numpy float32 +
  ml_dtypes, independently of tessera and torch): every format's codes, packed bytes, scales,
  zeros, dequantised values and ggml block bytes, checked bit for bit on every backend;
* ``quantize_blocks``' reference is the contract (``tessera.quant.contract``) for each
  granularity; backends agree bit for bit on random data (incl. dequantised floats);
* 4-bit packing, GPTQ (v1 / v2 zeros), AWQ and ggml converters against hand-written words;
* hypothesis fuzzing of ``quantize_blocks`` and ``dequantize_blocks`` (cpu vs reference);
* bad inputs name the argument.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera import quant
from tessera._registry import backend_available
from tessera.ops.dequantize import dequantize_blocks
from tessera.ops.quantize import quantize_blocks
from tessera.ops.quantize.ref import QTYPES
from tessera.quant import contract

GOLDEN = sorted(Path(__file__).with_name("golden").glob("*.json"))
BACKENDS = [b for b in ("reference", "cpu", "triton", "opencl") if backend_available(b, torch.device("cpu"))[0]]
NATIVE = [b for b in ("cpu", "opencl") if b in BACKENDS]   # the compiled backends the fuzz checks


def _f32(hexes):
    return torch.tensor([int(h, 16) for h in hexes], dtype=torch.int64).to(torch.int32).view(torch.float32)


def _bits(t):
    """Bit patterns of a float tensor (NaN == NaN, -0 != +0)."""
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def _golden_input(doc):
    vals = [float(v) for v in doc["input"]]
    return torch.tensor(vals, dtype=torch.float32).reshape(doc["shape"])


def test_every_format_has_a_golden_file():
    assert {json.loads(p.read_text())["format"] for p in GOLDEN} == set(quant.FORMATS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(path, backend):
    doc = json.loads(path.read_text())
    x = _golden_input(doc)
    info = quant.format_info(doc["format"])
    qt = quant.quantize(x, doc["format"], backend=backend)
    codes = torch.tensor(doc["codes"]).reshape(doc["shape"])
    if info.packed:
        assert qt.data.numpy().tobytes().hex() == doc["packed_hex"]
        assert torch.equal(quant.unpack_int4(qt.data).long(), codes)
    elif info.data_dtype.is_floating_point:
        assert torch.equal(qt.data.view(torch.uint8).long(), codes)
    else:
        assert torch.equal(qt.data.long(), codes)
    if info.scale_dtype == torch.float16:
        want = torch.tensor([int(h, 16) for h in doc["scale_hex"]]).to(torch.int16)
        assert torch.equal(qt.scale.view(torch.int16).reshape(-1), want)
        assert quant.to_ggml(qt).numpy().tobytes().hex() == doc["ggml_hex"]
    else:
        assert torch.equal(_bits(qt.scale).reshape(-1), _bits(_f32(doc["scale_hex"])))
    if doc["zero"] is None:
        assert qt.zero is None
    else:
        assert qt.zero.reshape(-1).tolist() == doc["zero"]
    deq = qt.dequantize(torch.float32, backend=backend)
    assert torch.equal(_bits(deq).reshape(-1), _bits(_f32(doc["dequant_hex"])))


def test_golden_ties_and_special_values_are_really_there():
    """The golden inputs must hold what they claim: exact .5 ties, NaN, inf, zero rows."""
    doc = json.loads(Path(__file__).with_name("golden").joinpath("int8-token.json").read_text())
    x = _golden_input(doc)
    q = x[0] / torch.tensor(doc["scale"][0], dtype=torch.float32)
    assert bool(((q - q.floor()) == 0.5)[:-1].all())           # every entry a tie
    assert doc["codes"][:4] == [-6, -6, -4, -4]                 # -6.5 -> -6, -5.5 -> -6: half to even
    assert torch.isnan(x).any() and torch.isinf(x).any() and bool((x[1] == 0).all())


# ---------------------------------------------------------------- the reference is the contract

def test_reference_is_the_contract():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 256, generator=g) * 3
    x[3, 5], x[4] = float("nan"), 0
    R = quantize_blocks
    for qt in (torch.int8, torch.int16, torch.float8_e4m3fn, torch.float8_e5m2):
        name = {torch.int8: "int8", torch.int16: "int16", torch.float8_e4m3fn: "fp8_e4m3",
                torch.float8_e5m2: "fp8_e5m2"}[qt]
        for got, want in ((R(x, name, 1, 0, backend="reference"), contract.quantize_rows(x, qt)),
                          (R(x, name, 0, 0, backend="reference"), contract.quantize_tensor(x, qt)),
                          (R(x, name, 128, 128, backend="reference"), contract.quantize_blocks(x, 128, qt))):
            assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(got[1], want[1])
    for g_ in (32, 64, 128):
        c, s = R(x, "int4", 1, g_, backend="reference")
        q, s2, _ = contract.quantize_groups(x, g_, "int4")
        assert torch.equal(quant.unpack_int4(c), q) and torch.equal(s, s2)
        c, s, z = R(x, "int4_zp", 1, g_, backend="reference")
        q, s2, z2 = contract.quantize_groups(x, g_, "int4", zero_point=True)
        assert torch.equal(quant.unpack_int4(c), q) and torch.equal(s, s2) and torch.equal(z, z2)
    # dequantisation: contract.dequantize_values, then the dtype cast
    qt = quant.quantize(x, "int4-g32-zp")
    want = contract.dequantize_values(quant.unpack_int4(qt.data).reshape(37, 8, 32), qt.scale[..., None],
                                      qt.zero[..., None]).reshape(37, 256)
    for b in BACKENDS:
        assert torch.equal(qt.dequantize(backend=b), want)
        assert torch.equal(qt.dequantize(torch.bfloat16, backend=b), want.bfloat16())


def test_scale_of_an_all_zero_block_and_inf_rule():
    x = torch.zeros(2, 32)
    x[1, 3] = float("inf")
    for b in BACKENDS:
        qt = quant.quantize(x, "int8-token", backend=b)
        assert qt.scale[0] == torch.tensor(1e-12, dtype=torch.float32) / 127 and bool((qt.data == 0).all())
        assert math.isinf(qt.scale[1]) and bool(torch.isnan(qt.dequantize(backend=b)[1]).all())


# ---------------------------------------------------------------- backends agree on random data

def _random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype)
    x.view(-1)[::97] *= 1000
    return x


@pytest.mark.parametrize("fmt", sorted(quant.FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_backends_bit_identical(fmt, dtype):
    x = _random((33, 256), dtype, hash(fmt) % 1000)
    if not quant.FORMATS[fmt].two_dim:
        x = x.reshape(3, 11, 256)
    outs = {b: quant.quantize(x, fmt, backend=b) for b in BACKENDS}
    ref = outs["reference"]
    for b, qt in outs.items():
        assert torch.equal(_bits(qt.data), _bits(ref.data)), b
        assert torch.equal(_bits(qt.scale), _bits(ref.scale)), b
        assert (qt.zero is None) == (ref.zero is None) and (qt.zero is None or torch.equal(qt.zero, ref.zero)), b
        for dt in (torch.float32, torch.bfloat16):
            assert torch.equal(_bits(qt.dequantize(dt, backend=b)), _bits(ref.dequantize(dt))), (b, dt)


@pytest.mark.parametrize("backend", NATIVE)
def test_non_contiguous_inputs(backend):
    w = torch.randn(256, 96)
    for fmt in ("int8-channel", "int4-g32-zp", "fp8-e4m3-block128", "q4_0"):
        a = quant.quantize(w.t(), fmt, backend=backend)          # a transposed view
        b = quant.quantize(w.t().contiguous(), fmt, backend="reference")
        assert torch.equal(_bits(a.data), _bits(b.data)) and torch.equal(a.scale, b.scale)
    wide = torch.randn(8, 300)
    a = quant.quantize(wide[:, 10:138], "int4-g64", backend=backend)   # row slice (stride 300)
    b = quant.quantize(wide[:, 10:138].contiguous(), "int4-g64", backend="reference")
    assert torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale)


def test_quality_sqnr():
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(3))

    def sqnr(fmt):
        e = quant.quantize(x, fmt).dequantize() - x
        return 20 * math.log10(float(x.norm() / e.norm()))
    assert sqnr("int8-channel") > 38 and sqnr("int16-token") > 85
    assert sqnr("int4-g32") > 19 and sqnr("int4-g128-zp") > 18 and sqnr("q4_0") > 19
    assert sqnr("fp8-e4m3-row") > 25 and sqnr("fp8-e5m2-block128") > 20 and sqnr("q8_0") > 40


def test_qtensor_nbytes():
    qt = quant.quantize(torch.randn(16, 128), "int4-g32-zp")
    assert qt.nbytes == 16 * 64 + 16 * 4 * 4 + 16 * 4
    assert quant.quantize(torch.randn(4, 64), "q8_0").nbytes == 4 * 64 + 4 * 2 * 2
    assert quant.Format.INT4_G128 == "int4-g128" and quant.format_info(quant.Format.Q4_0).scale_dtype == torch.float16


# ---------------------------------------------------------------- packing and converters

def test_pack_int4_layout_and_roundtrip():
    codes = torch.tensor([[1, 2, 15, 0, 7, 8]], dtype=torch.uint8)
    assert quant.pack_int4(codes).tolist() == [[0x21, 0x0F, 0x87]]       # low nibble = even k
    c = torch.randint(0, 16, (5, 3, 64), dtype=torch.uint8)
    assert torch.equal(quant.unpack_int4(quant.pack_int4(c)), c)
    with pytest.raises(ValueError, match="codes"):
        quant.pack_int4(torch.zeros(3, dtype=torch.uint8))


def _int4_qt(N=8, K=32, zp=True):
    codes = torch.tensor([[(3 * n + k) % 16 for k in range(K)] for n in range(N)], dtype=torch.uint8)
    codes[0, :8] = torch.arange(8)          # GPTQ word of column 0, k = 0..7: 0x76543210
    codes[:8, 0] = torch.arange(8)          # AWQ word of row k = 0, n = 0..7: 0x75316420
    scale = torch.linspace(0.5, 2.0, N * (K // 32)).reshape(N, K // 32)
    zero = (torch.arange(N * (K // 32)) % 15 + 1).to(torch.uint8).reshape(N, K // 32) if zp else None
    return quant.QTensor("int4-g32-zp" if zp else "int4-g32", quant.pack_int4(codes), scale, zero, (N, K)), codes


def _word(nibbles):
    w = sum(int(v) << (4 * i) for i, v in enumerate(nibbles))
    return w - (1 << 32) if w >= 1 << 31 else w


def test_gptq_layout():
    qt, codes = _int4_qt()
    for v1 in (True, False):
        g = quant.to_gptq(qt, v1=v1)
        assert g["qweight"].shape == (4, 8) and g["qzeros"].shape == (1, 1) and g["scales"].shape == (1, 8)
        assert g["qweight"][0, 0] == 0x76543210                          # k = 0..7 of column 0
        for r in range(4):
            for n in range(8):
                assert g["qweight"][r, n] == _word(codes[n, 8 * r:8 * r + 8])
        zs = [int(z) - (1 if v1 else 0) for z in qt.zero[:, 0]]
        assert g["qzeros"][0, 0] == _word(zs)
        back = quant.from_gptq(g["qweight"], g["qzeros"], g["scales"], g["group_size"], v1=v1)
        assert back.fmt == "int4-g32-zp" and torch.equal(back.data, qt.data) and torch.equal(back.zero, qt.zero)
        assert torch.equal(back.scale, qt.scale.half().float())          # fp16 rounding, then exact
    sym, _ = _int4_qt(zp=False)
    g = quant.to_gptq(sym)
    assert g["qzeros"][0, 0] == 0x77777777                               # v1 stores zero - 1 = 7
    assert quant.from_gptq(g["qweight"], g["qzeros"], g["scales"], 32).fmt == "int4-g32"
    assert quant.to_gptq(sym, v1=False)["qzeros"][0, 0] == _word([8] * 8)
    bad = quant.QTensor("int4-g32-zp", qt.data, qt.scale, torch.zeros_like(qt.zero), qt.shape)
    with pytest.raises(ValueError, match="zero point of 0"):
        quant.to_gptq(bad)


def test_gptq_dequant_matches_gptq_formula():
    """What a GPTQ kernel computes from the stored tensors equals tessera's dequantisation."""
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(4))
    qt = quant.quantize(x, "int4-g64-zp")
    qt.scale = qt.scale.half().float()                                   # what fp16 storage keeps
    g = quant.to_gptq(qt)
    K, N = 128, 16
    shifts = torch.arange(0, 32, 4)
    q = ((g["qweight"][:, None, :].long() >> shifts[None, :, None]) & 15).reshape(K, N)
    z = (((g["qzeros"][:, :, None].long() >> shifts) & 15) + 1).reshape(K // 64, N)      # v1: + 1
    w = (q - z.repeat_interleave(64, 0)).float() * g["scales"].float().repeat_interleave(64, 0)
    assert torch.equal(w.t(), qt.dequantize())


def test_awq_layout():
    qt, codes = _int4_qt()
    a = quant.to_awq(qt)
    assert a["qweight"].shape == (32, 1) and a["qzeros"].shape == (1, 1)
    assert a["qweight"][0, 0] == 0x75316420                              # n = 0..7 in order 0,2,4,6,1,3,5,7
    for k in range(32):
        assert a["qweight"][k, 0] == _word([codes[n, k] for n in quant.interop.AWQ_ORDER])
    assert a["qzeros"][0, 0] == _word([qt.zero[n, 0] for n in quant.interop.AWQ_ORDER])
    back = quant.from_awq(a["qweight"], a["qzeros"], a["scales"], a["group_size"])
    assert torch.equal(back.data, qt.data) and torch.equal(back.zero, qt.zero)
    assert torch.equal(back.scale, qt.scale.half().float())


def test_ggml_roundtrip_and_block_bytes():
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(5))
    for fmt, bb in (("q4_0", 18), ("q8_0", 34)):
        qt = quant.quantize(x, fmt)
        raw = quant.to_ggml(qt)
        assert raw.shape == (3, 3 * bb) and raw.dtype == torch.uint8
        back = quant.from_ggml(raw, fmt, (3, 96))
        assert torch.equal(back.data, qt.data) and torch.equal(_bits(back.scale), _bits(qt.scale))
        blk = raw[1, bb:2 * bb]                                           # row 1, block 1
        d = (blk[0] | (blk[1].long() << 8)).to(torch.int16).view(torch.float16)
        assert torch.equal(d, qt.scale[1, 1])
        if fmt == "q4_0":
            c = quant.unpack_int4(qt.data)[1, 32:64]
            assert blk[2:].tolist() == [int(c[j]) | int(c[j + 16]) << 4 for j in range(16)]
        else:
            assert blk[2:].view(torch.int8).tolist() == qt.data[1, 32:64].tolist()


# ---------------------------------------------------------------- fuzzing (spec.fuzz names this file)

_KINDS = [(q, br, bc) for q in QTYPES for br, bc in ((1, 0), (0, 0), (1, 32), (3, 8))
          if not (q == "q4_0" and br != 1)]


@settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "40")), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(kind=st.sampled_from(_KINDS), m=st.integers(0, 9), k=st.integers(1, 80),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       scale=st.sampled_from([1.0, 1e-6, 1e4]), seed=st.integers(0, 10**6), transposed=st.booleans())
def test_fuzz_quantize_blocks(kind, m, k, dtype, scale, seed, transposed):
    """quantize_blocks and dequantize_blocks: cpu (and opencl) == reference bit for bit on random shapes."""
    q, br, bc = kind
    k += k % 2 if QTYPES[q][2] else 0
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(k, m, generator=g, dtype=torch.float64) * scale).to(dtype).t() if transposed else \
        (torch.randn(m, k, generator=g, dtype=torch.float64) * scale).to(dtype)
    if x.numel():
        i = seed % x.numel()
        x[i // x.shape[1], i % x.shape[1]] = float("nan") if seed % 3 == 0 else 1e4
    b = quantize_blocks(x, q, br, bc, backend="reference")
    zero = b[2] if q == "int4_zp" else None
    for native in NATIVE:
        a = quantize_blocks(x, q, br, bc, backend=native)
        for u, v in zip(a, b):
            assert torch.equal(_bits(u), _bits(v)), native
        for dt in (torch.float32, dtype):
            da = dequantize_blocks(b[0], b[1], zero, br, bc, dt, backend=native)
            db = dequantize_blocks(b[0], b[1], zero, br, bc, dt, backend="reference")
            assert torch.equal(_bits(da), _bits(db)), native


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("call,exc,needle", [
    (lambda: quant.quantize(torch.randn(4, 48), "int4-g32"), ValueError, "divisible by 32"),
    (lambda: quant.quantize(torch.randn(4, 64), "int5"), ValueError, "'fmt'='int5'"),
    (lambda: quant.quantize(torch.randn(2, 4, 128), "fp8-e4m3-block128"), ValueError, "2-D"),
    (lambda: quant.quantize(torch.randn(4, 64, dtype=torch.float64), "int8-token"), TypeError, "float64"),
    (lambda: quantize_blocks(torch.randn(4, 7), "int4"), ValueError, "even last dimension"),
    (lambda: quantize_blocks(torch.randn(4, 8), "int8", block=-1), ValueError, "'block'"),
    (lambda: quantize_blocks(torch.randn(4, 8), "q4_0", block_rows=0, block=8), ValueError, "'block_rows'"),
    (lambda: dequantize_blocks(torch.zeros(4, 8, dtype=torch.int8), torch.ones(5)), ValueError, "'scale'"),
    (lambda: dequantize_blocks(torch.zeros(4, 8, dtype=torch.int8), torch.ones(4), torch.zeros(4, dtype=torch.uint8)),
     ValueError, "'zero'"),
    (lambda: dequantize_blocks(torch.zeros(4, 8, dtype=torch.int8), torch.ones(4), dtype=torch.int8), TypeError,
     "'dtype'"),
    (lambda: quant.dequantize(torch.zeros(3)), TypeError, "QTensor"),
])
def test_bad_input(call, exc, needle):
    with pytest.raises(exc, match=None) as info:
        call()
    assert needle in str(info.value), str(info.value)


def test_golden_files_are_the_independent_generator_output(tmp_path, monkeypatch):
    """Every committed golden file is exactly what tests/golden/make_golden.py (numpy + ml_dtypes,
    no tessera, no torch) writes: none holds tessera's own earlier output."""
    import importlib.util
    import shutil
    src = Path(__file__).with_name("golden")
    spec = importlib.util.spec_from_file_location("make_golden", src / "make_golden.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    assert "tessera" not in mg.__dict__ and "torch" not in mg.__dict__
    shutil.copytree(src / "gguf", tmp_path / "gguf")      # gguf-py's bytes are inputs there
    monkeypatch.setattr(mg, "HERE", tmp_path)
    mg.main()
    # requant/ has its own generator (gen_requant.py), checked the same way in test_requantize.py
    committed = sorted(p.relative_to(src) for p in src.rglob("*.json") if p.parent.name != "requant")
    assert committed == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    differ = [str(p) for p in committed if (src / p).read_bytes() != (tmp_path / p).read_bytes()]
    assert not differ, f"golden files not produced by make_golden.py: {differ}"


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_ggml_bytes_against_gguf_py(fmt):
    """tests/golden/gguf/: block bytes written by llama.cpp's own Python package (gguf-py) --
    tessera reads them exactly (dequantisation equals gguf's) and writes ``expected_hex``: the
    bytes of tessera's documented rule computed independently in numpy (make_golden.py), never
    tessera's own earlier output.  Those differ from gguf's only where ggml's rounding (half up /
    half away from zero) and tessera's (half to even) part: each differing byte is checked here
    to hold a value whose x / d is an exact .5 tie."""
    doc = json.loads(Path(__file__).with_name("golden").joinpath("gguf", f"{fmt}.json").read_text())
    assert "tessera_hex" not in doc, "golden bytes must not be tessera's own earlier output"
    x = _golden_input(doc)
    raw = torch.tensor(list(bytes.fromhex(doc["ggml_hex"])), dtype=torch.uint8).reshape(doc["shape"][0], -1)
    qt = quant.from_ggml(raw, fmt, doc["shape"])
    for b in BACKENDS:
        assert torch.equal(_bits(qt.dequantize(backend=b)).reshape(-1), _bits(_f32(doc["dequant_hex"])))
        mine = quant.to_ggml(quant.quantize(x, fmt, backend=b))
        assert mine.numpy().tobytes().hex() == doc["expected_hex"], b
    ours, theirs = bytes.fromhex(doc["expected_hex"]), bytes.fromhex(doc["ggml_hex"])
    differing = [i for i in range(len(ours)) if ours[i] != theirs[i]]
    assert differing == doc["differing_bytes"] and len(differing) <= 1
    # every difference is at a documented tie: x / d exactly n + 1/2 (d: the block's fp16 scale)
    per = 18 if fmt == "q4_0" else 34                     # fp16 d + 16 nibble pairs / 32 int8 codes
    xs = x.numpy().reshape(-1)
    for i in differing:
        blk, off = divmod(i, per)
        assert off >= 2, f"byte {i} is part of a scale, not a code"
        d = float(np.frombuffer(ours[blk * per:blk * per + 2], np.float16)[0])
        idx = [blk * 32 + off - 2] + ([blk * 32 + off - 2 + 16] if fmt == "q4_0" else [])
        q = [np.float32(xs[j]) / np.float32(d) for j in idx]
        assert any(float(v) - math.floor(float(v)) == 0.5 for v in q), (i, [float(v) for v in q])


def test_e4m3fnuz_has_no_negative_zero():
    """AMD's e4m3fnuz: 0x80 is NaN, so a negative value rounding to zero must give 0x00."""
    x = torch.tensor([[240.0, -1e-6, -0.0, float("nan"), -240.0, 2.0 ** -9]])
    for b in BACKENDS:
        qt = quant.quantize(x, "fp8-e4m3fnuz-row", backend=b)
        assert qt.data.view(torch.uint8).tolist() == [[0x7F, 0x00, 0x00, 0x00, 0xFF, 0x02]], b
        assert not bool(torch.isnan(qt.dequantize(backend=b)).any())


@pytest.mark.parametrize("qtype,fp8,qmax", [("fp8_e4m3", torch.float8_e4m3fn, 448.0),
                                            ("fp8_e5m2", torch.float8_e5m2, 57344.0),
                                            ("fp8_e4m3fnuz", torch.float8_e4m3fnuz, 240.0)])
def test_fp8_encoder_against_torch_cast(qtype, fp8, qmax):
    """Every backend's fp8 encoder equals torch's round-to-nearest-even cast on random fp32 bit
    patterns of every exponent (normal, subnormal, ties): rows start with QMAX, so scale == 1
    and the codes are the cast of the values themselves."""
    g = torch.Generator().manual_seed(6)
    bits = torch.randint(0, 2**31 - 1, (64, 1024), generator=g, dtype=torch.int64)
    v = bits.to(torch.int32).view(torch.float32)
    e = torch.randint(-30, 17, (64, 1024), generator=g).float()
    v = torch.copysign(torch.ldexp(torch.frexp(v).mantissa.abs(), e.int()), torch.randn(64, 1024, generator=g))
    v = torch.where(torch.isfinite(v), v, torch.zeros(())).clamp(-qmax, qmax)
    v[:, 0] = qmax
    want = v.to(fp8).view(torch.uint8)
    for b in BACKENDS:
        codes, scale = quantize_blocks(v, qtype, 1, 0, backend=b)
        assert bool((scale == 1).all())
        assert torch.equal(codes.view(torch.uint8), want), b
