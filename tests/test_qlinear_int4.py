"""Int4-weight linears (linear_w4a16, linear_w4a8): exact integer paths, packing, fuzzing, errors.

The spec matrix (tests/test_matrix.py, test_isa.py) compares every backend with the float64
reference under the float tolerance.  Here:

* exactness -- inputs for which every float operation of the contract is exact, so every
  backend (reference, cpu at every ISA level, the portable C loops, Triton interpreted, opencl) must give
  *bit-identical* results: W4A8 with random real x (its per-token int8 quantisation must match
  tessera.quant.contract bit for bit) and power-of-two group scales: every integer term the
  kernels form (a group accumulator acc_g, or the AVX-512 path's per-lane pieces of it, 16 per
  128 k) times s_g is an exact fp32 integer, and the test asserts sum_k |qx_k (q_k - z)| s_g < 2^24,
  which bounds every partial sum in ANY order or grouping, so the fp32 sums are exact whatever
  the kernel's summation order and only the final "* sx" rounds, once; W4A16 with small integer
  x.  A wrong group accumulator (overflow, a lost zero-point term, a nibble swapped)
  changes the result.
* the packing layout on a golden vector (low nibble = even k);
* hypothesis fuzzing of shapes, groups, zero points, layouts, bias, activation (cpu and opencl vs
  float64);
* bad inputs: ValueError/TypeError naming the argument.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, backend_available
from tessera.backends import cpu
from tessera.ops._qlinear_int4 import cpu as qcpu
from tessera.ops._qlinear_int4 import pack_int4, unpack_int4
from tessera.quant import contract
from tessera.testing.matrix import run_case

OPS = ("linear_w4a16", "linear_w4a8")


def _backends():
    """(name, ISA level or None, force portable C) for every way this machine can run the ops."""
    out = [("reference", None, False)]
    for level in cpu.supported_isas():
        out.append(("cpu", level, False))
    out.append(("cpu", cpu.supported_isas()[0], True))
    if backend_available("triton", torch.device("cpu"))[0]:
        out.append(("triton", None, False))
    if backend_available("opencl", torch.device("cpu"))[0]:
        out.append(("opencl", None, False))
    return out


def _run(fn, backend, level, force_c, monkeypatch, **kw):
    if level is not None:
        monkeypatch.setenv("TESSERA_CPU_ISA", level)
    monkeypatch.setattr(qcpu, "FORCE_C", [force_c])
    return fn(**kw, backend=backend)


def _weights(gen, N, K, group, zp):
    codes = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8)
    zero = torch.randint(0, 16, (N, K // group), generator=gen, dtype=torch.uint8) if zp else None
    scale = torch.pow(2.0, torch.randint(0, 4, (N, K // group), generator=gen).float())   # 1, 2, 4, 8
    return codes, pack_int4(codes), scale, zero


def _qz(codes, zero, group):
    z = torch.full_like(codes, 8) if zero is None else zero.repeat_interleave(group, 1)
    return codes.long() - z.long()                                                          # [N, K]


SHAPES = [(1, 32, 7, 32), (3, 384, 9, 32), (5, 192, 13, 64), (17, 384, 6, 128), (70, 256, 37, 64),
          (2, 4096, 5, 128)]


def _runs():
    """(backend, level, force_c, M, K, N, group): every backend x shape; the Triton interpreter
    (~ms per program) gets the shapes with K <= 512 only."""
    return [pytest.param(*b, *s, id=f"{b[0]}-{b[1]}-{'C' if b[2] else 'fast'}-{'x'.join(map(str, s))}")
            for b in _backends() for s in SHAPES if b[0] != "triton" or s[1] <= 512]


@pytest.mark.parametrize("backend,level,force_c,M,K,N,group", _runs())
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a8_accumulators_exact(backend, level, force_c, M, K, N, group, zp, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(M * 7 + K + N + group + zp)
    codes, weight, scale, zero = _weights(gen, N, K, group, zp)
    x = (torch.randn(M, K, generator=gen) * 3).to(dtype)
    x[0, 1] = 1e4 if M > 1 else x[0, 1]                  # an outlier row
    qx, sx = contract.quantize_rows(x, torch.int8)
    acc = (qx.long().reshape(M, 1, K // group, group) * _qz(codes, zero, group).reshape(N, K // group, group)).sum(-1)
    total = (acc.double() * scale.double()).sum(-1)       # exact: integers < 2^24
    # every partial sum, in any order / lane split, is bounded by the sum of |terms|: exact in fp32
    mag = (qx.long().abs().reshape(M, 1, K // group, group) *
           _qz(codes, zero, group).abs().reshape(N, K // group, group)).sum(-1).double() * scale.double()
    assert float(mag.sum(-1).max()) < 2 ** 24
    want = (sx.double()[:, None] * total).float().to(dtype)   # one fp32 rounding (sx * T), then dtype
    got = _run(tessera.linear_w4a8, backend, level, force_c, monkeypatch, x=x, weight=weight,
               weight_scale=scale, weight_zero=zero, group_size=group)
    assert torch.equal(got, want), f"max diff {float((got.double() - want.double()).abs().max())}"


@pytest.mark.parametrize("backend,level,force_c,M,K,N,group", _runs())
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_w4a16_integer_inputs_exact(backend, level, force_c, M, K, N, group, zp, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(M * 5 + K + N + group + zp)
    codes, weight, scale, zero = _weights(gen, N, K, group, zp)
    xi = torch.randint(-8, 9, (M, K), generator=gen)
    want = (xi @ (_qz(codes, zero, group) * scale.long().repeat_interleave(group, 1)).T)   # int64, exact
    assert int(want.abs().max()) < 2 ** 24
    got = _run(tessera.linear_w4a16, backend, level, force_c, monkeypatch, x=xi.to(dtype), weight=weight,
               weight_scale=scale, weight_zero=zero, group_size=group)
    assert torch.equal(got, want.to(torch.float32).to(dtype))


def test_pack_golden():
    codes = torch.tensor([[1, 2, 15, 0, 8, 7], [0, 15, 3, 12, 9, 9]], dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x0F, 0x78], [0xF0, 0xC3, 0x99]]
    assert torch.equal(unpack_int4(packed), codes)


@pytest.mark.parametrize("op", OPS)
def test_portable_and_avx512_paths_agree(op, monkeypatch):
    """Random real inputs: the vector kernels and the portable loops agree to the float tolerance
    (W4A8: they share the exact accumulators; only the fp32 epilogue order differs)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 640, generator=gen)
    w = torch.randn(37, 640, generator=gen)
    q, s, z = contract.quantize_groups(w, 64, "int4", True)
    fn = getattr(tessera, op)
    a = _run(fn, "cpu", None, False, monkeypatch, x=x, weight=pack_int4(q), weight_scale=s, weight_zero=z,
             group_size=64, activation="silu")
    b = _run(fn, "cpu", None, True, monkeypatch, x=x, weight=pack_int4(q), weight_scale=s, weight_zero=z,
             group_size=64, activation="silu")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- fuzzing (hypothesis)

@st.composite
def _draw(draw):
    group = draw(st.sampled_from([32, 64, 128]))
    K = group * draw(st.integers(1, 5))
    lead = draw(st.lists(st.integers(0, 9), min_size=1, max_size=2))
    N = draw(st.integers(1, 40))
    zp, has_bias = draw(st.booleans()), draw(st.booleans())
    act = draw(st.sampled_from([None, "relu", "gelu", "gelu_tanh", "silu"]))
    layout = draw(st.sampled_from(["contig", "rowslice", "transposed", "offset"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    scale = draw(st.sampled_from([1.0, 1e-3, 100.0]))
    return group, K, tuple(lead), N, zp, has_bias, act, layout, dtype, scale


def _case(group, K, lead, N, zp, has_bias, act, layout, dtype, scale):
    from tessera.testing import cases as C

    def make(dt, device, gen):
        x = C.make((*lead, K), dt, device, gen, layout, scale)
        q, s, z = contract.quantize_groups(torch.randn(N, K, generator=gen), group, "int4", zp)
        return {"x": x, "weight": pack_int4(q), "weight_scale": s, "weight_zero": z, "group_size": group,
                "bias": C.make((N,), dt, device, gen) if has_bias else None, "activation": act}
    return Case(f"fuzz[{lead}x{K}x{N} g{group} zp={zp} b={has_bias} {act} {layout} x{scale}]", make)


@pytest.mark.fuzz  # `pytest -m fuzz`: TESSERA_FUZZ_EXAMPLES >= 1000 (tests/conftest.py)
@pytest.mark.parametrize("op", OPS)
def test_fuzz_cpu_vs_reference(op):
    spec = tessera.OPS[op]

    @settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(drawn=_draw())
    def check(drawn):
        dtype = drawn[8]
        case = _case(*drawn)
        r = run_case(spec, "cpu", dtype, case)
        assert r.ok, f"{op} {case.name} {dtype}: {r.why}"

    check()


@pytest.mark.fuzz
@pytest.mark.parametrize("op", OPS)
def test_fuzz_opencl_vs_reference(op):
    if not backend_available("opencl", torch.device("cpu"))[0]:
        pytest.skip(backend_available("opencl", torch.device("cpu"))[1])
    spec = tessera.OPS[op]

    @settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(drawn=_draw())
    def check_opencl(drawn):
        dtype = drawn[8]
        case = _case(*drawn)
        r = run_case(spec, "opencl", dtype, case)
        assert r.ok, f"{op} opencl {case.name} {dtype}: {r.why}"

    check_opencl()


# ---------------------------------------------------------------- bad inputs

def _good(K=64, N=5, group=32):
    q, s, _ = contract.quantize_groups(torch.randn(N, K), group, "int4", False)
    return {"x": torch.randn(3, K), "weight": pack_int4(q), "weight_scale": s, "group_size": group}


BAD = [
    ("weight-int8", lambda kw: {**kw, "weight": kw["weight"].to(torch.int8)}, TypeError, "'weight'"),
    ("weight-1d", lambda kw: {**kw, "weight": kw["weight"].reshape(-1)}, ValueError, "'weight'"),
    ("k-mismatch", lambda kw: {**kw, "x": torch.randn(3, 32)}, ValueError, "'weight'"),
    ("odd-k", lambda kw: {**kw, "x": torch.randn(3, 63)}, ValueError, "'x'"),
    ("group-33", lambda kw: {**kw, "group_size": 33}, ValueError, "'group_size'"),
    ("group-float", lambda kw: {**kw, "group_size": 32.0}, TypeError, "'group_size'"),
    ("group-not-dividing", lambda kw: {**_good(K=96, group=32), "group_size": 64}, ValueError, "'group_size'"),
    ("scale-shape", lambda kw: {**kw, "weight_scale": kw["weight_scale"][:, :1]}, ValueError, "'weight_scale'"),
    ("scale-fp16", lambda kw: {**kw, "weight_scale": kw["weight_scale"].half()}, TypeError, "'weight_scale'"),
    ("zero-int32", lambda kw: {**kw, "weight_zero": torch.zeros(5, 2, dtype=torch.int32)}, TypeError,
     "'weight_zero'"),
    ("zero-shape", lambda kw: {**kw, "weight_zero": torch.zeros(5, 3, dtype=torch.uint8)}, ValueError,
     "'weight_zero'"),
    ("bias-size", lambda kw: {**kw, "bias": torch.zeros(4)}, ValueError, "'bias'"),
    ("activation", lambda kw: {**kw, "activation": "tanh"}, ValueError, "'activation'"),
    ("x-int", lambda kw: {**kw, "x": torch.zeros(3, 64, dtype=torch.int32)}, TypeError, "'x'"),
]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name,mutate,exc,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input(op, name, mutate, exc, needle):
    kw = mutate(_good())
    with pytest.raises(exc, match=needle):
        getattr(tessera, op)(**kw, backend="cpu")
