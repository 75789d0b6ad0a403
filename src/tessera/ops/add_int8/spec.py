"""add_int8's spec: cases (odd sizes, channels-last, broadcast, strided views, empty, extremes,
fused ReLU clamp, int16) and the benchmark rows (the residual adds of ResNet-18 and MobileNetV2,
channels-last codes, against what a user writes in plain PyTorch: dequantize, add, quantize)."""
from __future__ import annotations

import torch

from ..._registry import Case, OpSpec, register_op
from .._requant.ref import CODE_RANGE
from . import DTYPES, OP, LEFT_SHIFT, add_int8, add_int8_ref, resolve


def add_case(name, shape, b_shape=None, layout="contig", tags=(), relu=False, extreme=False, params=None):
    """Random codes and TFLite-like parameters: input multipliers in [2^30, 2^31) with shifts in
    [-3, 0] (each scaled input ~ (x - zp) 2^(left_shift - 1 .. 4)), an output multiplier bringing
    the sum back to about the code range (shift left_shift - 1 .. left_shift + 1 down)."""
    def mk(dtype, device, gen):
        dt = dtype if dtype in DTYPES else torch.int8
        lo, hi = CODE_RANGE[dt]
        L = LEFT_SHIFT[dt]

        def codes(shp):
            pad = 3 if layout == "strided" else 0
            t = torch.randint(lo, hi + 1, (*shp[:-1], shp[-1] + pad), generator=gen, dtype=dt)
            if layout == "strided":
                t = t[..., 1:shp[-1] + 1]
            elif layout == "channels_last" and len(shp) == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            if extreme:
                t.view(-1)[::2] = hi   # alternating extremes, every sum at its largest magnitude
                t.view(-1)[1::2] = lo
            return t

        a, b = codes(shape), codes(b_shape or shape)
        r = lambda lo_, hi_: int(torch.randint(lo_, hi_, (), generator=gen))   # noqa: E731
        zp = (lambda: r(-100, 100)) if dt == torch.int8 else (lambda: 0)
        kw = {"a": a, "a_zero_point": zp(), "a_multiplier": r(2**30, 2**31), "a_shift": r(-3, 1),
              "b": b, "b_zero_point": zp(), "b_multiplier": r(2**30, 2**31), "b_shift": r(-3, 1),
              "out_multiplier": r(2**30, 2**31), "out_shift": -r(L - 1, L + 2), "out_zero_point": zp()}
        if extreme:   # the largest multipliers, one negative, and an output shift that saturates
            kw.update(a_multiplier=2**31 - 1, b_multiplier=-2**31, a_shift=0, b_shift=0, out_shift=-(L - 4))
        if relu:
            kw["qmin"] = kw["out_zero_point"]
        kw.update(params or {})
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return Case(name, mk, frozenset(tags))


def _cases():
    return [
        add_case("7", (7,)),
        add_case("3x123", (3, 123)),
        add_case("1025", (1025,), relu=True),
        add_case("2x5x7x9", (2, 5, 7, 9)),
        add_case("channels-last-2x5x7x9", (2, 5, 7, 9), layout="channels_last", tags={"layout"}),
        add_case("channels-last-1x33x3x3-relu", (1, 33, 3, 3), layout="channels_last", relu=True, tags={"layout"}),
        add_case("broadcast-3x123-by-123", (3, 123), b_shape=(123,), tags={"layout"}),
        add_case("broadcast-2x6x4x5-by-6x1x1", (2, 6, 4, 5), b_shape=(6, 1, 1), tags={"layout"}),
        add_case("strided-4x37", (4, 37), layout="strided", tags={"layout"}),
        add_case("empty-0x16", (0, 16), tags={"empty"}),
        add_case("extreme-5x77", (5, 77), extreme=True, tags={"extreme"}),
        add_case("left-shift-3-2x65", (2, 65), params={"left_shift": 3, "out_shift": -2}),
    ]


# residual adds at batch 1 (C, H): ResNet-18's four stages, MobileNetV2's 24/32/64/96/160-channel blocks
RESIDUALS = [(64, 56), (128, 28), (256, 14), (512, 7), (24, 56), (32, 28), (64, 14), (96, 14), (160, 7)]


def _bytes(kw):
    return 3 * kw["a"].numel() * kw["a"].element_size()


def add_int8_eager(a, a_zero_point, a_multiplier, a_shift, b, b_zero_point, b_multiplier, b_shift, out_multiplier,
                   out_shift, out_zero_point=0, qmin=None, qmax=None, *, left_shift=None):
    """What a user writes in plain PyTorch without an integer add: dequantize both operands to
    fp32, add, quantize (rint, clamp).  The benchmark's baseline, not a bit-exact reference (one
    float rounding instead of TFLite's three fixed-point ones)."""
    qmin, qmax, left_shift = resolve(a, a_zero_point, a_multiplier, a_shift, b_zero_point, b_multiplier, b_shift,
                                     out_multiplier, out_shift, out_zero_point, qmin, qmax, left_shift)
    real = lambda m, s: m * 2.0 ** (s - 31)   # noqa: E731
    sa = real(a_multiplier, a_shift) * real(out_multiplier, out_shift) * 2.0 ** left_shift
    sb = real(b_multiplier, b_shift) * real(out_multiplier, out_shift) * 2.0 ** left_shift
    y = (a.float() - a_zero_point).mul_(sa) + (b.float() - b_zero_point).mul_(sb)   # broadcasts
    return y.round_().add_(out_zero_point).clamp_(qmin, qmax).to(a.dtype)


SPEC = register_op(OpSpec(
    name=OP, fn=add_int8, ref=add_int8_ref, eager=add_int8_eager,
    kernels={"reference": f"tessera.ops.{OP}.ref", "cpu": f"tessera.ops.{OP}.cpu", "triton": f"tessera.ops.{OP}.triton"},
    cases=_cases(), grad_inputs=(), dtypes=DTYPES,
    bytes_fwd=_bytes, flops_fwd=lambda kw: 24 * kw["a"].numel(),
    bench_cases=[add_case(f"residual-b{B}-{C}x{H}", (B, C, H, H), layout="channels_last",
                          tags=() if B == 1 else {"extended"})
                 for B in (1, 8) for C, H in RESIDUALS],
    fuzz="test_add_int8.py",
))
