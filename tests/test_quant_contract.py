"""The integer contract's three implementations agree bit for bit: the torch rules
(``tessera.quant.contract``), the C header (``csrc/tessera_quant.h``) and the Triton helpers
(``backends/triton_lang.py``), on every fp8 code, on rounding ties and on the special values."""
from pathlib import Path

import pytest
import torch

from tessera.backends import cpu
from tessera.quant import contract as C

SHIM = Path(__file__).parent / "csrc" / "quant_contract.c"
KINDS = {torch.int8: 0, torch.int16: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}


def _lib():
    return cpu.library("test_quant_contract", SHIM)


def _values():
    """Random magnitudes over fp8's whole range, exact ties (k + 0.5, fp8 midpoints), the
    saturation edges, subnormals, signed zeros, inf and NaN."""
    g = torch.Generator().manual_seed(0)
    rnd = torch.randn(4000, generator=g) * torch.exp2(torch.randint(-20, 17, (4000,), generator=g).float())
    ties = torch.arange(-300, 300).float() + 0.5
    e4 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    e5 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e5m2).float()
    mids = torch.cat([(e4[:-1] + e4[1:]) / 2, (e5[:-1] + e5[1:]) / 2])  # fp8 rounding ties
    edges = torch.tensor([127.4999, 127.5, 128.0, -128.5, 32767.5, 448.0, 464.0, 480.0, 57344.0, 61440.0,
                          1e30, -1e30, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 2 ** -9, 2 ** -10,
                          3 * 2 ** -11, 2 ** -16, 2 ** -17, 3 * 2 ** -18])
    v = torch.cat([rnd, ties, e4, e5, mids, edges])
    return v[torch.isfinite(v) | torch.isinf(v) | torch.isnan(v)]


@pytest.mark.parametrize("qtype", list(KINDS), ids=str)
def test_c_quantize_matches_torch_contract(qtype):
    x = _values().contiguous()
    scale = torch.ones_like(x)
    scale[::3] = 0.37  # a non-power-of-two scale: the division must be a true fp32 division
    want = C.quantize_values(x, scale, qtype)
    out = torch.empty(x.shape, dtype=qtype if qtype not in C.FP8 else torch.uint8)
    fn = cpu.declare(_lib(), "tsr_test_quant", "pplip")
    assert fn(x.data_ptr(), scale.data_ptr(), x.numel(), KINDS[qtype], out.data_ptr()) == 0
    got = out.view(qtype) if qtype in C.FP8 else out
    bad = (got.view(torch.uint8) if qtype in C.FP8 else got) != (want.view(torch.uint8) if qtype in C.FP8 else want)
    assert not bad.any(), f"{qtype}: first mismatches at x={x[bad][:5].tolist()}"


@pytest.mark.parametrize("fmt", C.FP8, ids=str)
def test_c_fp8_decode_every_code(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    out = torch.empty(256)
    fn = cpu.declare(_lib(), "tsr_test_fp8_decode", "plip")
    fn(codes.data_ptr(), 256, int(fmt == torch.float8_e5m2), out.data_ptr())
    want = codes.view(fmt).float()
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(out[ok], want[ok]) and torch.equal(torch.signbit(out[ok]), torch.signbit(want[ok]))


def test_c_absmax_counts_nan_as_zero():
    fn = cpu.declare(_lib(), "tsr_test_absmax", "plp")
    out = torch.empty(1)
    for x in (torch.tensor([1.0, float("nan"), -3.0]), torch.tensor([float("nan")]), torch.tensor([-float("inf"), 2.0])):
        fn(x.data_ptr(), x.numel(), out.data_ptr())
        assert out.item() == C.absmax(x, None).item()


def test_contract_rules_by_hand():
    # round half to even after a true division; saturation; NaN -> 0; zero block -> zeros
    q, s = C.quantize_rows(torch.tensor([[2.5, -127.0, 0.5, float("nan")]]), torch.int8)
    assert s.item() == 1.0 and q.tolist() == [[2, -127, 0, 0]]
    q, s = C.quantize_rows(torch.zeros(1, 4), torch.int8)
    assert s.item() == pytest.approx(1e-12 / 127) and q.abs().sum() == 0
    # symmetric int4: offset binary codes, scale = amax / 7
    q, s, z = C.quantize_groups(torch.tensor([[7.0, -7.0, 3.5, 0.0]]), 4)
    assert z is None and s.item() == 1.0 and q.tolist() == [[15, 1, 12, 8]]
    # asymmetric int4: range [min(x,0), max(x,0)] over 15 steps, zero exact
    q, s, z = C.quantize_groups(torch.tensor([[0.0, 1.5, 3.0, 15.0]]), 4, zero_point=True)
    assert s.item() == 1.0 and z.item() == 0 and q.tolist() == [[0, 2, 3, 15]]
    deq = C.dequantize_values(q, s, z)  # one group: [1, 1] scale/zero broadcast over the row
    assert deq.tolist() == [[0.0, 2.0, 3.0, 15.0]]


def test_triton_helpers_match_contract():
    from tessera.backends import triton as tb
    if not tb.interpreted() and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest) or a GPU")
    from _quant_contract_triton import decode, encode

    x = _values()
    x = x[torch.isfinite(x)].contiguous()
    for qtype, kind in ((torch.int8, 0), (torch.float8_e4m3fn, 2), (torch.float8_e5m2, 3)):
        want = C.quantize_values(x, torch.ones(()), qtype)
        want = want.view(torch.uint8).int() if qtype in C.FP8 else want.int()
        got = encode(x, C.QMAX[qtype], kind)
        assert torch.equal(got & 0xFF if qtype in C.FP8 else got, want), qtype
    for fmt in C.FP8:
        codes = torch.arange(256, dtype=torch.int32)
        want = codes.to(torch.uint8).view(fmt).float()
        finite = torch.isfinite(want)
        got = decode(codes, fmt == torch.float8_e5m2)
        assert torch.equal(got[finite], want[finite]), fmt
        assert torch.equal(torch.signbit(got[finite]), torch.signbit(want[finite])), f"{fmt}: -0.0 lost its sign"


# ---------------------------------------------------------------- OpenCL (csrc/opencl/tessera_quant_cl.h)

OCL_SHIM = Path(__file__).parent / "csrc" / "quant_contract.cl"
OCL_KINDS = {torch.int8: 0, torch.int16: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3,
             torch.float8_e4m3fnuz: 4}


# tsr_div_rn's paths: the fp64 quotient (devices with cl_khr_fp64), the fp32 fma correction of the
# device's quotient, and that correction from a quotient up to two ulps off (OpenCL 1.2 allows 2.5)
DIV_PATHS = {"fp64": {}, "fp32": {"TSR_QDIV_FP32": 1}, "fp32-off-by-2ulp": {"TSR_QDIV_FP32": 1, "TSR_DIV_SKEW": 1}}


def _ocl(path):
    from tessera._registry import backend_available
    ok, why = backend_available("opencl", torch.device("cpu"))
    if not ok:
        pytest.skip(why)
    from tessera.backends import opencl as ocl
    if path == "fp64" and "cl_khr_fp64" not in ocl.runtime().extensions:
        pytest.skip("the device has no cl_khr_fp64")
    return ocl, ocl.program(OCL_SHIM, DIV_PATHS[path])


def _ocl_run(ocl, prg, name, n, args, out):
    bout = ocl.buffer(out)
    ocl.launch(prg, name, (ocl.round_up(max(n, 1), 64),), None, [*args, bout], written=(bout,))
    return out


@pytest.mark.parametrize("path", list(DIV_PATHS))
def test_opencl_division_is_correctly_rounded(path):
    """tsr_div_rn equals IEEE fp32 division (torch) on random operands of every magnitude, on each
    path, also when the device's own quotient is up to two ulps off (OpenCL 1.2's allowance)."""
    ocl, prg = _ocl(path)
    g = torch.Generator().manual_seed(5)
    n = 200000
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-60, 60, (n,), generator=g).float())
    y = torch.randn(n, generator=g) * torch.exp2(torch.randint(-60, 60, (n,), generator=g).float())
    y[::7] = torch.tensor([127.0, 7.0, 15.0, 448.0, 57344.0, 240.0, 32767.0, -8.0]).repeat(n)[: y[::7].numel()]
    x[:6] = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-30, 3.0])
    y[:6] = torch.tensor([3.0, 3.0, 2.0, 1.0, 1e30, float("inf")])
    out = _ocl_run(ocl, prg, "test_div", n, [ocl.buffer(x), ocl.buffer(y), ocl.i64(n)], torch.empty(n))
    want = x / y
    assert torch.equal(out.view(torch.int32), want.view(torch.int32)), \
        f"first mismatches: {[(a, b) for a, b in zip(x[out != want][:3].tolist(), y[out != want][:3].tolist())]}"
    amax = torch.cat([x.abs()[1000:2000], torch.tensor([0.0, float("inf"), 1e-13])])
    for qtype in (torch.int8, torch.int16, "int4", torch.float8_e4m3fn, torch.float8_e5m2):
        qmax = C.QMAX[qtype]
        got = _ocl_run(ocl, prg, "test_scale", amax.numel(), [ocl.buffer(amax), ocl.i64(amax.numel()), ocl.f32(qmax)],
                       torch.empty(amax.numel()))
        assert torch.equal(got, C.scale_for(amax, qtype)), qtype


@pytest.mark.parametrize("path", list(DIV_PATHS))
@pytest.mark.parametrize("qtype", list(OCL_KINDS), ids=str)
def test_opencl_quantize_matches_torch_contract(qtype, path):
    ocl, prg = _ocl(path)
    x = _values().contiguous()
    scale = torch.ones_like(x)
    scale[::3] = 0.37  # a non-power-of-two scale: the division must be a true fp32 division
    if qtype == torch.float8_e4m3fnuz:   # not in the contract's table: ops/quantize/ref.py's rule
        want = C.nan_to_zero(x / scale).clamp(-240.0, 240.0).to(qtype)
    else:
        want = C.quantize_values(x, scale, qtype)
    want = want.view(torch.uint8).int() if want.dtype.itemsize == 1 and want.dtype.is_floating_point else want.int()
    got = _ocl_run(ocl, prg, "test_quant", x.numel(),
                   [ocl.buffer(x), ocl.buffer(scale), ocl.i64(x.numel()), ocl.i32(OCL_KINDS[qtype])],
                   torch.empty(x.numel(), dtype=torch.int32))
    bad = got != want
    assert not bad.any(), f"{qtype}: first mismatches at x={x[bad][:5].tolist()}"


@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz], ids=str)
def test_opencl_fp8_decode_every_code(fmt):
    ocl, prg = _ocl("fp32")
    out = torch.empty(256)
    bout = ocl.buffer(out)
    ocl.launch(prg, "test_fp8_decode", (256,), None, [ocl.i32(OCL_KINDS[fmt]), bout], written=(bout,))
    want = torch.arange(256, dtype=torch.uint8).view(fmt).float()
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(out[ok], want[ok]) and torch.equal(torch.signbit(out[ok]), torch.signbit(want[ok]))
