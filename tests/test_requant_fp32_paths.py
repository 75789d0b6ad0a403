"""The int8 depthwise VPDPBUSD kernel and the double rounding through fp32 (csrc/tessera_requant.h
rq_f_double), against the int64 reference and against the paths they replace.

* rq_f_double rounds y = a m 2^-(31+e) + copysign(2^-(e+1), a) in fp32 and hands every vector with a
  lane within 2^-11 of a half-integer to the integer form.  Multipliers 2^30, 2^30 +- 1, 3 2^29
  make exact and near ties common (x = a / 2^(1+e) is a tie for every odd a at m = 2^30; at
  2^30 + 1 the fp32 multiplier rounds to 2^30 and only the check tells the two apart); shifts
  0, 1, 2, 7, 20, 31 and a left shift of 1 (which keeps the integer form); both signs of the accumulator;
  clamps inside the int8 range (a fused ReLU6) and at its ends.  Both consumers: the depthwise
  kernels' register sums and the int8 GEMM's requantized tile (small K, 1x1 conv / linear).
* dwv_rows (requant.c): 3x3, stride 1 or 2, any padding, odd heights (a last pair of one row),
  widths below and across its 4-pixel tile, channel counts off the 16 / 64 grid.
TESSERA_RQ_FP32=0 / TESSERA_DW_VNNI=0 switch the new paths off per call; every result is compared
with the reference bit for bit either way.
"""
from __future__ import annotations

import pytest
import torch

import tessera

TIES = [2**30, 2**30 + 1, 2**30 - 1, 3 * 2**29, 2**31 - 1, 1518500250]


def _scales(n, gen, e_choices):
    m = torch.tensor(TIES, dtype=torch.int64)[torch.randint(0, len(TIES), (n,), generator=gen)]
    e = torch.tensor(e_choices)[torch.randint(0, len(e_choices), (n,), generator=gen)]
    return m.to(torch.int32), (-e).to(torch.int32)


def _both(monkeypatch, var, call):
    """call() with the path on and with var=0; both must equal the reference"""
    got = call("cpu")
    monkeypatch.setenv(var, "0")
    try:
        old = call("cpu")
    finally:
        monkeypatch.delenv(var)
    want = call("reference")
    assert torch.equal(got, want)
    assert torch.equal(old, want)


@pytest.mark.parametrize("e_choices", [[0], [1], [2, 7], [20, 31], [0, 1, 2, 7, 20, 31, -1]])
@pytest.mark.parametrize("clamp", ["full", "relu6", "narrow"])
def test_fp32_double_rounding_depthwise(monkeypatch, e_choices, clamp):
    C = 70
    gen = torch.Generator().manual_seed(len(e_choices) * 10 + len(clamp))
    w = torch.randint(-128, 128, (C, 1, 3, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-(1 << 20), 1 << 20, (C,), generator=gen, dtype=torch.int32)
    m, s = _scales(C, gen, e_choices)
    x = torch.randint(-128, 128, (2, C, 11, 13), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    zp, qmin, qmax = {"full": (-3, -128, 127), "relu6": (-128, -128, -20), "narrow": (100, 90, 110)}[clamp]
    for stride in (1, 2):
        _both(monkeypatch, "TESSERA_RQ_FP32", lambda be: tessera.conv2d_int8(
            x, 7, w, b, m, s, zp, stride, 1, 1, C, qmin, qmax, backend=be))


@pytest.mark.parametrize("e_choices", [[0], [1], [2, 7], [1, 2, 7, 20, 31], [0, 1, 2, 7, 20, 31, -1]])
@pytest.mark.parametrize("M,K,N", [(200, 16, 96), (300, 27, 33), (130, 64, 40), (150, 24, 120), (203, 16, 16),
                                   (101, 32, 32), (150, 8, 7), (77, 20, 21), (99, 32, 80)])
def test_fp32_double_rounding_gemm_tile(monkeypatch, e_choices, M, K, N):
    """rq_tile_f8 (every e >= 1): 4 rows a register for N <= 16, 2 for N <= 32 (adjacent rows, one
    store, where N is 16 / 32; row counts off the grid), one for 33..64 and the 64-column chunks;
    e = 0 or a left shift: the 16-wide fp32 form or the integer form."""
    gen = torch.Generator().manual_seed(M + K + N + len(e_choices))
    x = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    m, s = _scales(N, gen, e_choices)
    for bias in (None, torch.randint(-(1 << 18), 1 << 18, (N,), generator=gen, dtype=torch.int32)):
        for zp, qmin, qmax in ((5, -128, 127), (-128, -128, -80), (100, 90, 110)):
            _both(monkeypatch, "TESSERA_RQ_FP32", lambda be: tessera.linear_int8_requant(
                x, -9, w, bias, m, s, zp, qmin, qmax, backend=be))
    # the same GEMM under a 1x1 conv (channels-last codes: the rows are the GEMM's columns)
    xc = torch.randint(-128, 128, (1, K, 10, 20), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    _both(monkeypatch, "TESSERA_RQ_FP32", lambda be: tessera.conv2d_int8(
        xc, 3, w.reshape(N, K, 1, 1), None, m, s, -1, backend=be))


@pytest.mark.parametrize("stride,padding", [(1, 1), (2, 1), (1, 0), (2, 0), (1, 2), (2, 2)])
@pytest.mark.parametrize("C,H,W", [(1, 1, 1), (16, 2, 7), (33, 5, 8), (70, 8, 17), (144, 7, 9), (64, 3, 2)])
def test_depthwise_vnni_kernel(monkeypatch, stride, padding, C, H, W):
    gen = torch.Generator().manual_seed(C * 1000 + H * 10 + W)
    if padding == 0:
        H, W = max(H, 3), max(W, 3)   # at least one output
    w = torch.randint(-128, 128, (C, 1, 3, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-30000, 30000, (C,), generator=gen, dtype=torch.int32)
    x = torch.randint(-128, 128, (2, C, H, W), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    for per_ch, rounding, out_dtype in ((True, "double", torch.int8), (False, "single", torch.int16)):
        n = C if per_ch else 1
        m = torch.randint(2**30, 2**31 - 1, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        s = torch.randint(-12, 1, (n,), generator=gen, dtype=torch.int32)
        for zp in (-128, 127):
            _both(monkeypatch, "TESSERA_DW_VNNI", lambda be: tessera.conv2d_int8(
                x, zp, w, b, m, s, 4, stride, padding, 1, C, 0 if zp == 127 else None,
                rounding=rounding, out_dtype=out_dtype, backend=be))
    # a strided view (every other column of a wider channels-last tensor): the row reads use sw
    xs = torch.randint(-128, 128, (1, C, H, 2 * W), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)[..., ::2]
    _both(monkeypatch, "TESSERA_DW_VNNI", lambda be: tessera.conv2d_int8(
        xs, 1, w, b, m, s, 0, stride, padding, 1, C, backend=be))


@pytest.mark.parametrize("stride,H", [(1, 23), (2, 23), (2, 26)])
def test_depthwise_vnni_kernel_threads(monkeypatch, stride, H):
    """The row-pair items split across 3 threads (static chunks that start and end inside an
    image): at stride 2 each item's second quad is the next item's first (dwv_run), so a thread's
    first item, and each new image, must build it afresh; odd and even Ho (a last item of one row)."""
    gen = torch.Generator().manual_seed(H + stride)
    C = 40
    w = torch.randint(-128, 128, (C, 1, 3, 3), generator=gen, dtype=torch.int8)
    b = torch.randint(-30000, 30000, (C,), generator=gen, dtype=torch.int32)
    m = torch.randint(2**30, 2**31 - 1, (C,), generator=gen, dtype=torch.int64).to(torch.int32)
    s = torch.randint(-12, 1, (C,), generator=gen, dtype=torch.int32)
    x = torch.randint(-128, 128, (3, C, H, 21), generator=gen, dtype=torch.int8).contiguous(
        memory_format=torch.channels_last)
    assert x.numel() * 3 >= 1 << 15   # past PARALLEL_MIN_ELEMENTS: the kernel runs on every thread
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        _both(monkeypatch, "TESSERA_DW_VNNI", lambda be: tessera.conv2d_int8(
            x, 5, w, b, m, s, -2, stride, 1, 1, C, backend=be))
    finally:
        torch.set_num_threads(threads)


def test_fp32_double_rounding_sweep(monkeypatch):
    """A 1-column linear (acc = x w + bias, exactly controlled) through the GEMM tile, and the same
    accumulators through tessera.requantize: every int8
    code x, 4096 output channels with weights +-1 / +-3 / 127 / -128, biases spread so y mostly
    lands inside the int8 range (where only the distrust check separates fp32 from the exact
    rounding), multipliers uniform over [2^29, 2^31) plus the tie set, negative and zero ones (the
    integer form), shifts 0..31.  ~1M lanes: near-ties by the hundreds."""
    gen = torch.Generator().manual_seed(7)
    N = 4096
    x = torch.arange(-128, 128, dtype=torch.int8).reshape(256, 1)
    w = torch.tensor([1, -1, 3, -3, 127, -128], dtype=torch.int8)[torch.randint(0, 6, (N,), generator=gen)]
    m = torch.randint(2**29, 2**31, (N,), generator=gen, dtype=torch.int64)
    pick = torch.randint(0, 8, (N,), generator=gen)
    m = torch.where(pick == 0, torch.tensor(TIES)[torch.randint(0, len(TIES), (N,), generator=gen)], m)
    m = torch.where(pick == 1, -m, m)
    m = torch.where(pick == 2, 2**30 + 2**7 + torch.randint(-2**6, 2**6, (N,), generator=gen), m).to(torch.int32)
    m[:3] = torch.tensor([0, -2**31, 2**31 - 1], dtype=torch.int32)
    e = torch.randint(0, 32, (N,), generator=gen)
    e = torch.where(torch.rand(N, generator=gen) < 0.7, torch.randint(0, 8, (N,), generator=gen), e)
    # |y| ~ |acc| / 2^(e+1): biases within 400 2^(e+1), capped to keep acc + bias in int32 easily
    span = (400 * 2.0 ** (e + 1)).clamp(max=2**30).long()
    bias = ((torch.rand(N, generator=gen) * 2 - 1) * span).long().to(torch.int32)
    s = (-e).to(torch.int32)
    acc = (x.int() * w.int() + bias).contiguous()
    for zp, qmin, qmax in ((0, -128, 127), (-100, -128, 0)):
        _both(monkeypatch, "TESSERA_RQ_FP32", lambda be: tessera.linear_int8_requant(
            x, 0, w.reshape(N, 1), bias, m, s, zp, qmin, qmax, backend=be))
        # the standalone op on the same accumulators (tsr_requant's row blocks), and on a column slice
        _both(monkeypatch, "TESSERA_RQ_FP32", lambda be: tessera.requantize(acc, m, s, zp, qmin, qmax, backend=be))
        _both(monkeypatch, "TESSERA_RQ_FP32", lambda be: tessera.requantize(
            acc[:, 5:1000], m[5:1000], s[5:1000], zp, qmin, qmax, backend=be))


@pytest.mark.parametrize("N", [16, 48, 64])
@pytest.mark.parametrize("e", [0, 1])
def test_fp32_tile_extreme_accumulators(N, e):
    """Accumulators at the int32 ends (x = -128 against w = -128 / 127, the bias at the fold's
    bound): at e = 0 and m = 2^31 - 1, fl(a) S reaches 2^31, which no int32 conversion holds --
    rq_tile_f8 (no fp32 clamp) must leave such channels to the clamped form; at e = 1 it runs.
    M = 40: the broadcast GEMM's requantized tile (M <= 16 takes the int32 scratch path)."""
    K = 16
    x = torch.full((40, K), -128, dtype=torch.int8)
    w = torch.where(torch.arange(N) % 2 == 0, -128, 127).to(torch.int8)[:, None].expand(N, K).contiguous()
    big = 2**31 - 1 - K * 2**14
    bias = torch.where(torch.arange(N) % 2 == 0, big, -big).to(torch.int32)
    m = torch.full((N,), 2**31 - 1, dtype=torch.int32)
    s = torch.full((N,), -e, dtype=torch.int32)
    for zp, qmin, qmax in ((0, -128, 127), (-7, -128, 100)):
        args = (x, 0, w, bias, m, s, zp, qmin, qmax)
        assert torch.equal(tessera.linear_int8_requant(*args, backend="cpu"),
                           tessera.linear_int8_requant(*args, backend="reference"))


@pytest.mark.parametrize("M,C", [(7, 16), (5, 30), (3, 9)])
def test_fp32_tile_reads_no_row_past_the_end(M, C):
    """rq_tile_f8 packs 4 rows (C <= 16) or 2 (C <= 32) a register: a last group of fewer rows
    must not load the missing ones.  tessera.requantize on accumulators that end at a page that
    faults on access (tessera.testing.fence), in a child process (a fault kills it)."""
    import subprocess
    import sys
    code = (f"import torch, tessera\nfrom tessera.testing.fence import fenced\n"
            f"acc = fenced(torch.randint(-2**20, 2**20, ({M}, {C}), dtype=torch.int32), 'end')\n"
            f"m = torch.full(({C},), 2**30 + 5, dtype=torch.int32); s = torch.full(({C},), -3, dtype=torch.int32)\n"
            f"got = tessera.requantize(acc, m, s, 3, -128, 127, backend='cpu')\n"
            f"want = tessera.requantize(acc.clone(), m, s, 3, -128, 127, backend='reference')\n"
            f"assert torch.equal(got, want)\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
