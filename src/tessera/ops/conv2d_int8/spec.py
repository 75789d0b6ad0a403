"""conv2d_int8's spec: cases (odd sizes, stride/dilation/groups, depthwise, channels-last,
strided views, empty batch, extremes, int16) and the roofline / benchmark rows (ResNet-18
layer shapes, against fp32 F.conv2d through ``peers``)."""
from __future__ import annotations

import torch

from ..._registry import Case, OpSpec, register_op
from . import OP, _ref, _resolve, conv2d_int8
from ..linear_int8_requant import X_DTYPES


def conv_case(name, N, C, H, W, O, k, stride=1, padding=0, dilation=1, groups=1, layout="contig", tags=(),
              per_channel=True, bias=True, relu=False, extreme=False):
    def mk(dtype, device, gen):
        dt = dtype if dtype in X_DTYPES else torch.int8
        lo, hi = (-128, 128) if dt == torch.int8 else (-32768, 32768)
        x = torch.randint(lo, hi, (N, C, H, W + (3 if layout == "strided" else 0)), generator=gen, dtype=dt)
        if layout == "strided":
            x = x[..., 1:W + 1]
        elif layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randint(-127, 128, (O, C // groups, k, k), generator=gen, dtype=torch.int8)
        if extreme:
            x.fill_(hi - 1 if dt == torch.int8 else lo)
            w.fill_(-127)
        n = O if per_channel else 1
        mult = torch.randint(2**30, 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        if dt == torch.int8:
            xzp = int(torch.randint(-128, 128, (), generator=gen))
            b = torch.randint(-2**16, 2**16, (O,), generator=gen, dtype=torch.int32) if bias else None
            shift = torch.randint(-14, -6, (n,), generator=gen, dtype=torch.int32)
            ozp, top = int(torch.randint(-20, 20, (), generator=gen)), 127
        else:
            xzp, ozp, top = 0, 0, 32767
            b = torch.randint(-2**34, 2**34, (O,), generator=gen, dtype=torch.int64) if bias else None
            shift = torch.randint(-22, -12, (n,), generator=gen, dtype=torch.int32)
        if not per_channel:
            mult, shift = mult.reshape(()), shift.reshape(())
        qmin = ozp if relu else -top - 1
        kw = {"x": x, "x_zero_point": xzp, "weight": w, "bias": b, "multiplier": mult, "shift": shift,
              "out_zero_point": ozp, "stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
              "qmin": qmin, "qmax": top}
        return {kk: (v.to(device) if isinstance(v, torch.Tensor) else v) for kk, v in kw.items()}
    return Case(name, mk, frozenset(tags))


def _cases():
    return [
        conv_case("1x3x7x5-o8-k3-p1", 1, 3, 7, 5, 8, 3, padding=1),
        conv_case("2x4x9x7-o6-k3-s2-g2", 2, 4, 9, 7, 6, 3, stride=2, groups=2, relu=True),
        conv_case("1x5x9x7-dw-k3-d2-p2", 1, 5, 9, 7, 5, 3, padding=2, dilation=2, groups=5),
        conv_case("1x8x5x5-o3-k1-tensor", 1, 8, 5, 5, 3, 1, per_channel=False),
        conv_case("1x3x1x1-o7-k1", 1, 3, 1, 1, 7, 1),
        conv_case("2x6x7x9-o5-k1-s2", 2, 6, 7, 9, 5, 1, stride=2),   # strided 1x1: x subsampled first
        conv_case("channels-last-1x5x5x7-o4-k1-s21", 1, 5, 5, 7, 4, 1, stride=(2, 1), layout="channels_last",
                  tags={"layout"}),
        conv_case("2x6x6x6-o5-k2-nobias", 2, 6, 6, 6, 5, 2, stride=(1, 2), padding=(1, 0), bias=False),
        conv_case("channels-last-1x4x7x6-o5-k3", 1, 4, 7, 6, 5, 3, padding=1, layout="channels_last",
                  tags={"layout"}),
        conv_case("strided-1x3x6x7-o4-k3", 1, 3, 6, 7, 4, 3, padding=1, layout="strided", tags={"layout"}),
        conv_case("empty-0x3x5x5-o4-k3", 0, 3, 5, 5, 4, 3, tags={"empty"}),
        conv_case("extreme-1x64x4x4-o3-k3", 1, 64, 4, 4, 3, 3, padding=1, extreme=True, tags={"extreme"}),
    ]


# ResNet-18 layer shapes (batch 1): (C, H, O, k, stride, padding)
RESNET18 = [(64, 56, 64, 3, 1, 1), (64, 56, 128, 3, 2, 1), (128, 28, 128, 3, 1, 1), (128, 28, 256, 3, 2, 1),
            (256, 14, 256, 3, 1, 1), (256, 14, 512, 3, 2, 1), (512, 7, 512, 3, 1, 1), (64, 56, 128, 1, 2, 0)]


def _out_hw(kw):
    x, w = kw["x"], kw["weight"]
    s, p, d = (kw["stride"],) * 2 if isinstance(kw["stride"], int) else kw["stride"], kw["padding"], kw["dilation"]
    s = s if isinstance(s, (tuple, list)) else (s, s)
    p = p if isinstance(p, (tuple, list)) else (p, p)
    d = d if isinstance(d, (tuple, list)) else (d, d)
    Ho = (x.shape[2] + 2 * p[0] - d[0] * (w.shape[2] - 1) - 1) // s[0] + 1
    Wo = (x.shape[3] + 2 * p[1] - d[1] * (w.shape[3] - 1) - 1) // s[1] + 1
    return Ho, Wo


def _flops(kw):
    Ho, Wo = _out_hw(kw)
    w = kw["weight"]
    return 2 * kw["x"].shape[0] * Ho * Wo * w.numel()


def _bytes(kw):
    x, w = kw["x"], kw["weight"]
    Ho, Wo = _out_hw(kw)
    return x.numel() * x.element_size() + w.numel() + x.shape[0] * w.shape[0] * Ho * Wo * x.element_size()


def conv2d_int8_eager(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point=0, stride=1, padding=0,
                      dilation=1, groups=1, qmin=None, qmax=None, *, rounding=None, out_dtype=None):
    """What a user writes in plain PyTorch without an int8 conv: fp32 F.conv2d (oneDNN here) of
    the dequantized integers and a float requantization (round(acc * scale) + zp, clamp).  It is
    the benchmark's baseline (the issue's target: int8 conv >= 2x fp32 F.conv2d), not a bit-exact
    reference (fp32 sums of > 2^24 and the float scale can differ from the integer contract)."""
    out_dtype, qmin, qmax, _ = _resolve(x, out_zero_point, qmin, qmax, rounding, out_dtype)
    xf = (x.float() - float(x_zero_point)).contiguous()   # NCHW: oneDNN segfaults on some tiny channels-last shapes
    acc = torch.nn.functional.conv2d(xf, weight.float(), None if bias is None else bias.float(), stride, padding,
                                     dilation, groups)
    scale = multiplier.float().reshape(-1, 1, 1) * torch.exp2(shift.float().reshape(-1, 1, 1) - 31.0)
    return (torch.round(acc * scale) + out_zero_point).clamp(qmin, qmax).to(out_dtype)


SPEC = register_op(OpSpec(
    name=OP, fn=conv2d_int8, ref=_ref, eager=conv2d_int8_eager,
    kernels={"reference": f"tessera.ops.{OP}.ref", "cpu": f"tessera.ops.{OP}.cpu", "triton": f"tessera.ops.{OP}.triton"},
    cases=_cases(), grad_inputs=(), dtypes=X_DTYPES,
    bytes_fwd=_bytes, flops_fwd=_flops, bound="compute", compute_dtype="int8",
    bench_cases=[conv_case(f"resnet18-b{B}-{C}x{H}-o{O}-k{k}-s{s}", B, C, H, H, O, k, stride=s, padding=p,
                           tags=() if B == 1 else {"extended"})
                 for B in (1, 8) for C, H, O, k, s, p in RESNET18],
    fuzz="test_requantize.py", scalar_ok=("multiplier", "shift"),
))
