"""tessera.linear_fp8 beyond the generated matrix: exact products/accumulation on data whose fp32
sum is exact, bit-exact per-token quantisation through an identity weight, both CPU paths
(VDPBF16PS and portable fp32), hypothesis fuzzing (spec.fuzz names this file), bad input."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tessera
from tessera._registry import Case
from tessera.backends import triton as triton_backend
from tessera.ops.linear_fp8 import SPEC
from tessera.ops.linear_fp8 import cpu as fp8_cpu
from tessera.ops.linear_fp8.cases import make_weight
from tessera.quant import contract
from tessera.testing.matrix import run_case

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TRITON = triton_backend.interpreted() and tessera._registry.backend_available("triton", torch.device("cpu"))[0]
OPENCL = tessera._registry.backend_available("opencl", torch.device("cpu"))[0]
BACKENDS = ["reference", "cpu"] + (["triton"] if TRITON else []) + (["opencl"] if OPENCL else [])


@pytest.fixture(params=["bf16dp", "fp32"])
def cpu_path(request, monkeypatch):
    """Run the cpu backend on its VDPBF16PS path (where the CPU has it) and its fp32 path."""
    if request.param == "bf16dp" and not fp8_cpu.bf16dp():
        pytest.skip("this CPU/ISA level has no AVX512_BF16: only the fp32 path exists")
    monkeypatch.setattr(fp8_cpu, "USE_BF16DP", request.param == "bf16dp")
    return request.param


def _grid_values(shape, gen, lim=16):
    """Values with <= 2 significant bits and |v| <= lim: exact in e4m3 and e5m2."""
    table = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 16], dtype=torch.float32)
    table = table[table <= lim]
    v = table[torch.randint(0, len(table), shape, generator=gen)]
    return v * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)


def _exact_inputs(M, N, K, kind, fmt, gen):
    """x and weight on the fp8 grid with a 448 in every scale block: all scales are exactly 1,
    every product is an integer multiple of the weights' unit and every partial sum stays far
    below 2^24 units, so the fp32 accumulation is exact and the output must equal the float64
    reference bit for bit.  (e5m2: QMAX 57344 anchors the weight scale; the other weights are
    multiples of 256.)"""
    x = _grid_values((M, K), gen)
    top = 448.0 if fmt == E4M3 else 57344.0
    w = _grid_values((N, K), gen) * (1.0 if fmt == E4M3 else 256.0)
    step = 128 if kind == "block" else K
    x[:, ::step] = 448.0
    if kind == "tensor":
        w[0, 0] = top
    elif kind == "row":
        w[:, 0] = top
    else:
        w[::128, ::128] = top
    q, s = make_weight_from(w, kind, fmt)
    assert torch.equal(q.float(), w) and bool((s == 1).all())
    return x, q, s


def make_weight_from(w, kind, fmt):
    if kind == "tensor":
        return contract.quantize_tensor(w, fmt)
    if kind == "row":
        return contract.quantize_rows(w, fmt)
    return contract.quantize_blocks(w, 128, fmt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("M,N,K,kind,fmt", [(1, 9, 200, "row", E4M3), (5, 7, 300, "block", E5M2),
                                           (70, 20, 130, "tensor", E4M3), (3, 130, 260, "block", E4M3),
                                           (66, 12, 96, "row", E5M2)])
def test_exact_accumulation(backend, M, N, K, kind, fmt, cpu_path):
    x, w, s = _exact_inputs(M, N, K, kind, fmt, torch.Generator().manual_seed(M * 1000 + K))
    y = tessera.linear_fp8(x, w, s, backend=backend)
    ref = x.double() @ w.double().T
    assert torch.equal(y.double(), ref), float((y.double() - ref).abs().max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [False, True])
def test_quantisation_bit_exact(backend, dtype, block, cpu_path):
    """An identity weight (codes 448, scale 1/448) routes every quantised x element to one output:
    y[m, k] = fp32(q[m, k] * 448) * fp32(sx * sw), which torch's fp32 reproduces exactly (the
    reference backend rounds once, from float64)."""
    gen = torch.Generator().manual_seed(7)
    K = 300 if block else 123
    x = (torch.randn(9, K, generator=gen) * torch.logspace(-3, 3, K)).to(dtype)
    x[0, :4] = float("nan")
    x[1] = 0
    eye = torch.eye(K)
    w, s = make_weight_from(eye, "block" if block else "tensor", E4M3)
    y = tessera.linear_fp8(x.float() if dtype == torch.float32 else x, w, s, backend=backend).float()
    if block:
        xp = torch.zeros(9, 384)
        xp[:, :K] = x.float()
        q, sx = contract.quantize_rows(xp.view(9, 3, 128), E4M3)
        q, sx = q.view(9, 384)[:, :K], sx.repeat_interleave(128, 1)[:, :K]
        sw = s[0, 0] if s.numel() == 1 else s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:K, :K].diagonal()
    else:
        q, sx = contract.quantize_rows(x.float(), E4M3)
        sx, sw = sx[:, None], s
    if backend == "reference":
        expect = ((q.double() * 448.0) * (sx.double() * sw.double())).float()
    else:
        expect = (q.float() * 448.0) * (sx * sw)
    assert torch.equal(y, expect.to(dtype).float()), int((y != expect.to(dtype).float()).sum())


@pytest.mark.parametrize("case", [c for c in SPEC.cases if "large" not in c.tags], ids=lambda c: c.name)
def test_cpu_fp32_path_matrix(case, monkeypatch):
    """The portable fp32 path on the best ISA level (test_isa covers it at generic/avx2)."""
    monkeypatch.setattr(fp8_cpu, "USE_BF16DP", False)
    for dtype in SPEC.dtypes:
        r = run_case(SPEC, "cpu", dtype, case)
        assert r.ok, r.why


# ---------------------------------------------------------------- hypothesis fuzz (spec.fuzz)

@settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "60")), deadline=None)
@given(M=st.integers(0, 70), N=st.integers(1, 140), K=st.integers(1, 300),
       kind=st.sampled_from(["tensor", "row", "block"]), fmt=st.sampled_from([E4M3, E5M2]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       layout=st.sampled_from(["contig", "rowslice", "transposed"]), bias=st.booleans(),
       act=st.sampled_from([None, "relu", "gelu", "gelu_tanh", "silu"]), fp32_path=st.booleans())
def test_fuzz_cpu_vs_reference(M, N, K, kind, fmt, dtype, layout, bias, act, fp32_path):
    from tessera.testing import cases as C

    def make(dt, device, gen):
        w, s = make_weight(N, K, kind, fmt, gen)
        x = C.make((M, K), dt, device, gen, layout if M > 1 else "contig")
        return {"x": x, "weight": w, "weight_scale": s, "activation": act,
                "bias": C.make((N,), dt, device, gen) if bias else None}
    old = fp8_cpu.USE_BF16DP
    fp8_cpu.USE_BF16DP = not fp32_path
    try:
        r = run_case(SPEC, "cpu", dtype, Case(f"fuzz-{M}-{N}-{K}-{kind}-{layout}", make))
    finally:
        fp8_cpu.USE_BF16DP = old
    assert r.ok, r.why
    if OPENCL:   # the same draw on the opencl backend
        r = run_case(SPEC, "opencl", dtype, Case(f"fuzz-{M}-{N}-{K}-{kind}-{layout}", make))
        assert r.ok, f"opencl: {r.why}"


# ---------------------------------------------------------------- bad input

def _kw():
    w, s = make_weight(8, 16, "row", E4M3, torch.Generator().manual_seed(0))
    return {"x": torch.randn(2, 16), "weight": w, "weight_scale": s}


@pytest.mark.parametrize("change,exc,needle", [
    ({"weight": torch.zeros(8, 16, dtype=torch.int8)}, TypeError, "'weight'"),
    ({"weight": torch.zeros(8, 17, dtype=E4M3)}, ValueError, "'weight'"),
    ({"weight_scale": torch.ones(9)}, ValueError, "'weight_scale'"),
    ({"weight_scale": torch.ones(1, 2)}, ValueError, "'weight_scale'"),
    ({"weight_scale": torch.ones(8, dtype=torch.float16)}, TypeError, "'weight_scale'"),
    ({"bias": torch.ones(7)}, ValueError, "'bias'"),
    ({"activation": "tanh"}, ValueError, "'activation'"),
    ({"activation": 3}, TypeError, "'activation'"),
    ({"x": torch.randn(2, 0)}, ValueError, "'x'"),
])
def test_bad_input(change, exc, needle):
    with pytest.raises(exc, match=needle) as info:
        tessera.linear_fp8(**{**_kw(), **change}, backend="cpu")
    assert "linear_fp8" in str(info.value)


def test_per_tensor_block_and_row_scales_accepted():
    kw = _kw()
    for s in (torch.tensor(0.01), torch.full((8,), 0.01), torch.full((1, 1), 0.01)):
        y = tessera.linear_fp8(kw["x"], kw["weight"], s, backend="cpu")
        ref = SPEC.ref(x=kw["x"].double(), weight=kw["weight"], weight_scale=s.double())
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton path: TRITON_INTERPRET=1 only")
def test_triton_interpreted_smoke():
    kw = _kw()
    y = tessera.linear_fp8(**kw, backend="triton")
    torch.testing.assert_close(y, tessera.linear_fp8(**kw, backend="reference"), rtol=1e-5, atol=1e-5)
