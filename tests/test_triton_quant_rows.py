"""``backends.triton_lang.quantize_rows``: the one Triton per-token quantiser (linear_w8a8,
linear_a16w8 and linear_w4a8 all call it) equals ``tessera.quant.contract.quantize_rows`` bit
for bit: codes and fp32 scales, on rows with ties, NaN, inf-free extremes, an all-zero row, fp32
/ fp16 / bf16 inputs and a row stride wider than K (a slice of a fused projection)."""
from __future__ import annotations

import pytest
import torch

from tessera._registry import backend_available
from tessera.quant import contract

if not backend_available("triton", torch.device("cpu"))[0]:
    pytest.skip("the triton backend is not available here (TRITON_INTERPRET=1 not set?)",
                allow_module_level=True)

from tessera.backends.triton_lang import quantize_rows  # noqa: E402  (imports triton)


def _rows(qmax: float, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    K = 37
    wide = torch.randn(6, K + 5, generator=g, dtype=torch.float64) * 3
    x = wide[:, 3:3 + K].clone()
    x[0] = 0.0                               # all zero: scale 1e-12 / QMAX, codes 0
    x[1, ::4] = float("nan")                 # NaN -> 0, and ignored by amax
    x[2] = 0.5                               # ties: amax = qmax -> scale 1, x = k + 0.5
    x[2, :8] = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, qmax])
    x[3] *= 1e4                              # large magnitudes
    x[4, 5] = -65000.0                       # one outlier dominating the row
    x[5] = 3 * (torch.arange(K, dtype=torch.float64) - 18.5)  # scale 3 (not a power of two):
    x[5, 0] = 3 * qmax                       # x / 3 = k + 0.5 exactly, ties to even
    out = torch.zeros(6, K + 5, dtype=dtype)
    out[:, 3:3 + K] = x.to(dtype)
    return out[:, 3:3 + K]                   # row stride K + 5 in the kernel's dtype too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qtype", [torch.int8, torch.int16], ids=["int8", "int16"])
def test_matches_the_contract_bit_for_bit(qtype, dtype):
    qmax = float(torch.iinfo(qtype).max)
    x = _rows(qmax if dtype == torch.float32 else 64.0, dtype)
    assert x.stride(0) != x.shape[1]
    q, s = quantize_rows(x, qtype)
    q_ref, s_ref = contract.quantize_rows(x.float(), qtype)
    assert q.dtype == qtype and s.dtype == torch.float32 and q.is_contiguous()
    assert torch.equal(s, s_ref), (s, s_ref)
    assert torch.equal(q, q_ref), (q != q_ref).nonzero()[:8]


def test_rejects_other_dtypes_and_layouts():
    with pytest.raises(ValueError, match="int8 or torch.int16"):
        quantize_rows(torch.zeros(2, 4), torch.int32)
    with pytest.raises(ValueError, match="unit inner stride"):
        quantize_rows(torch.zeros(2, 8)[:, ::2], torch.int8)
