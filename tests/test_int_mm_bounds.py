"""The integer bound of the int8 matmuls, tested at its exact edge (issue #13 item 5).

The largest |int8 x int8| sum is K * (-128) * (-128) = K * 2^14: it fits int32 for K <= 131071
and is exactly 2^31 (wrapping to -2^31) at K = 131072.  So:

* K = 131071 with every term (-128) * (-128) (and a row of (-128) * 127) gives the exact
  sums on reference, cpu, triton and opencl, bit for bit, for int8 and int16 ``a``;
* K = 131072 is rejected with an error naming the argument and the bound, by int_mm and by the
  linears built on the same accumulators (the reference, called directly, raises instead of
  wrapping, so it can never agree with a kernel on a wrapped value);
* int16 x int8 sums far outside int32 (-32768 * -128 = 2^22 per term, past the CPU's 4096-K
  int64 flush) are exact in the int64 result on every backend.

Expected values are computed with Python integers, not with any backend.
"""
from __future__ import annotations

import pytest
import torch

import tessera
from tessera._registry import supports
from tessera.ops._qlinear_int8.ref import int_mm_ref

BACKENDS = ("reference", "cpu", "triton", "opencl")
EDGE_K = 131071


def _backend(name, dtype):
    ok, why = supports(tessera.OPS["int_mm"], name, torch.device("cpu"), dtype)
    if not ok:
        pytest.skip(why)
    return name


def _extremes(M, N, K, dtype):
    """a: row 0 all at the type's minimum, row 1 at its maximum; b: rows -128, 127, -128.  Every
    (row, col) sum is K times one product, including the largest one, min * -128."""
    info = torch.iinfo(dtype)
    a = torch.full((M, K), info.min, dtype=dtype)
    a[1::2] = info.max
    b = torch.full((N, K), -128, dtype=torch.int8)
    b[1::2] = 127
    expect = [[K * int(a[m, 0]) * int(b[n, 0]) for n in range(N)] for m in range(M)]
    return a, b, torch.tensor(expect, dtype=torch.int64)  # int_mm's int8 result: .to(int32) where it fits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16], ids=["int8", "int16"])
def test_k_edge_is_exact(dtype, backend):
    a, b, expect = _extremes(2, 3, EDGE_K, dtype)
    if dtype == torch.int8:
        assert int(expect[0, 0]) == 2**31 - 2**14  # the largest sum the bound allows
        expect = expect.to(torch.int32)
    out = tessera.int_mm(a, b, backend=_backend(backend, dtype))
    assert out.dtype == expect.dtype and torch.equal(out, expect), (out, expect)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16], ids=["int8", "int16"])
def test_k_past_the_bound_is_rejected(dtype, backend):
    a, b, _ = _extremes(1, 1, EDGE_K + 1, dtype)
    with pytest.raises(ValueError, match=r"argument 'a'.*1\.\.131071"):
        tessera.int_mm(a, b, backend=_backend(backend, dtype))


@pytest.mark.parametrize("op", ["linear_w8a8", "linear_a16w8"])
def test_linears_share_the_bound(op):
    K = EDGE_K + 1
    with pytest.raises(ValueError, match=r"argument 'x'.*1\.\.131071"):
        getattr(tessera, op)(torch.randn(1, K), torch.zeros(1, K, dtype=torch.int8), torch.ones(1))


def test_reference_never_wraps():
    a = torch.full((1, EDGE_K + 1), -128, dtype=torch.int8)
    with pytest.raises(ValueError, match="overflow the int32 result"):
        int_mm_ref(a, a.clone())  # the true sum is 2^31: torch._int_mm would return -2^31
    a = a[:, 1:]
    assert int(int_mm_ref(a, a.clone())) == EDGE_K * 2**14


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("K", [600, 4100])
def test_int16_sums_beyond_int32_are_exact(K, backend):
    """2^22 per term: int32 would overflow past K = 511; K = 4100 also crosses the CPU's flush of
    its int32 lanes into int64 (every 4096 K)."""
    a, b, expect = _extremes(3, 5, K, torch.int16)
    assert int(expect.abs().max()) > 2**31
    out = tessera.int_mm(a, b, backend=_backend(backend, torch.int16))
    assert torch.equal(out, expect), (out, expect)
