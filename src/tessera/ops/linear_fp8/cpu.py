"""linear_fp8 native CPU launcher (kernel: linear_fp8.c).

``USE_BF16DP`` (module attribute, default True) lets tests force the portable fp32 path on a
CPU that has AVX512_BF16; :func:`bf16dp` says whether the VDPBF16PS path runs here.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import as_fp32_param, new_output
from ...backends import cpu
from .ref import scale_kind

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("linear_fp8.c")
_KIND = {"tensor": 0, "row": 1, "block": 2}
from .._qlinear_int8.ref import ACT_CODE  # noqa: E402  (the epilogue activation codes shared by the linears)
USE_BF16DP = True


def _lib():
    return cpu.library("linear_fp8", _SRC)


def bf16dp() -> bool:
    """True when the kernels use AVX512_BF16 dot products (avx512 build on a CPU that has them)."""
    return bool(cpu.declare(_lib(), "tsr_linear_fp8_bf16dp", "")())


def forward(x, weight, weight_scale, bias, activation):
    M, K = x.shape
    N = weight.shape[0]
    y = new_output((M, N), x.dtype, x.device)
    if M == 0:
        return y
    b = as_fp32_param(bias)  # keep a reference: the kernel reads it
    f = cpu.declare(_lib(), "tsr_linear_fp8", "plppppllliiiiii")
    rc = f(cpu.ptr(x), x.stride(0), cpu.ptr(weight), cpu.ptr(weight_scale), cpu.ptr(b),
           cpu.ptr(y), M, N, K, _KIND[scale_kind(weight_scale)], cpu.DTYPE_CODE[x.dtype],
           int(weight.dtype == torch.float8_e5m2), ACT_CODE[activation], int(USE_BF16DP),
           cpu.threads_for(M * N * K // 16))
    cpu.check_rc(rc, "linear_fp8")
    return y


def backward(*args):
    raise NotImplementedError("linear_fp8 has no gradient (inference only)")
