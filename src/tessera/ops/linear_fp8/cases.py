"""Test and benchmark cases of linear_fp8.

Weights are random N(0, 1) floats quantised with the contract (per tensor, per row or 128x128
blocks; e4m3fn or e5m2), so the codes span the formats' range; x is N(0, 1) in the case's
layout.  Shapes cover GEMV (M = 1 .. 16) and GEMM (M >= 64) paths, odd M/N/K, partial 128
blocks on both weight dims, 3-D and non-contiguous x, bias and every activation, extreme
values (outliers 1e4, zero rows, NaN -> 0 by the contract) and empty M.
"""
from __future__ import annotations

import torch

from ..._registry import Case
from ...quant import contract
from ... import _cases as C
from .ref import BLOCK

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def make_weight(N, K, kind, fmt, gen, scale=1.0):
    """(weight fp8 [N, K], fp32 weight_scale) from random N(0, scale^2) values."""
    w = torch.randn(N, K, generator=gen, dtype=torch.float32) * scale
    if kind == "tensor":
        return contract.quantize_tensor(w, fmt)
    if kind == "row":
        return contract.quantize_rows(w, fmt)
    return contract.quantize_blocks(w, BLOCK, fmt)


def _build(name, lead, K, N, kind="row", fmt=E4M3, layout="contig", bias=True, activation=None,
           tags=(), special=None, bias_fp32=False, wscale=1.0):
    def mk(dtype, device, gen):
        w, s = make_weight(N, K, kind, fmt, gen, wscale)
        x = C.make((*lead, K), dtype, device, gen, layout)
        if special is not None:
            x = special(x.clone() if layout == "contig" else x)
        kw = {"x": x, "weight": w.to(device), "weight_scale": s.to(device), "activation": activation}
        if bias:
            kw["bias"] = C.make((N,), torch.float32 if bias_fp32 else dtype, device, gen)
        else:
            kw["bias"] = None
        return kw
    tag = f"-{kind}" + ("-e5m2" if fmt == E5M2 else "") + (f"-{activation}" if activation else "") + \
        ("" if bias else "-nobias")
    return Case(name + tag, mk, frozenset(tags))


def _outliers(x):
    x.view(-1, x.shape[-1])[0, ::7] = 1e4          # a row dominated by outliers
    x.view(-1, x.shape[-1])[-1, 3] = -1e4
    return x


def _zero_nan(x):
    x2 = x.view(-1, x.shape[-1])
    x2[0] = 0                                       # amax 0: scale 1e-12/448, codes 0, y = bias
    x2[1, :5] = float("nan")                        # NaN quantises to 0 (the contract)
    return x


def cases():
    out = [
        _build("2x16x8", (2,), 16, 8),                          # small, every tensor >= 8 elements
        _build("1x33x7", (1,), 33, 7),                          # GEMV, odd K/N
        _build("7x123x33", (7,), 123, 33, bias=False),
        _build("3x5x123x77", (3, 5), 123, 77, activation="relu"),
        _build("16x64x40", (16,), 64, 40, activation="silu", bias_fp32=True),
        _build("9x100x20", (9,), 100, 20, fmt=E5M2),
        _build("4x48x24", (4,), 48, 24, kind="tensor", bias=False),
        _build("5x64x24", (5,), 64, 24, kind="tensor", fmt=E5M2, activation="gelu"),
        _build("3x300x260", (3,), 300, 260, kind="block"),      # partial 128 blocks on N and K
        _build("2x260x40", (2,), 260, 40, kind="block", fmt=E5M2, bias=False, activation="gelu_tanh"),
        _build("66x96x36", (66,), 96, 36, activation="gelu"),   # GEMM path (M >= 64)
        _build("70x200x130", (70,), 200, 130, kind="block", activation="silu"),
        _build("65x33x17", (65,), 33, 17, kind="tensor", bias=False),
    ]
    for layout in C.LAYOUTS[1:]:
        out.append(_build(f"{layout}-5x3x123x29", (5, 3), 123, 29, layout=layout, tags={"layout"}))
    out += [
        # outliers of 1e4 in x against small weights (1e-4 * N(0, 1): y stays O(1), so the fp32
        # tolerance applies unchanged while the per-token scale is set by the outliers and the
        # ordinary entries fall into e4m3's subnormal range)
        _build("outliers-6x128x32", (6,), 128, 32, special=_outliers, tags={"extreme"}, wscale=1e-4),
        _build("outliers-4x300x16", (4,), 300, 16, kind="block", special=_outliers, tags={"extreme"}, wscale=1e-4),
        _build("zero-nan-3x64x16", (3,), 64, 16, special=_zero_nan, tags={"extreme"}),
        _build("zero-nan-3x200x16", (3,), 200, 16, kind="block", special=_zero_nan, tags={"extreme"}),
        _build("empty0x64x16", (0,), 64, 16, tags={"empty"}),
        _build("large-1x4096x300", (1,), 4096, 300, tags={"large"}),
        _build("large-80x1024x520", (80,), 1024, 520, kind="block", tags={"large"}),
        _build("large-130x4096x64", (130,), 4096, 64, fmt=E5M2, tags={"large"}),
        _build("large-300x256x70", (300,), 256, 70, activation="silu", tags={"large"}),   # 2 token tiles of 256
    ]
    return out


def bench_cases():
    out = []
    for M, K, N in ((1, 4096, 4096), (1, 4096, 11008), (16, 4096, 4096), (128, 4096, 4096)):
        out.append(_build(f"M{M}-K{K}-N{N}", (M,), K, N, bias=False))
    out.append(_build("M1-K4096-N4096", (1,), 4096, 4096, kind="block", bias=False))
    return out
