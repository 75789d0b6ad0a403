"""max_pool2d_int8's spec: cases (odd sizes, strides, padding, dilation, ceil_mode, rectangular
windows, channels-last / NCHW / strided views, unbatched, empty batch, extremes, int16) and the
benchmark rows (ResNet-18's stem pool, channels-last codes, against PyTorch's max_pool2d on a float
copy: torch has no int16 max_pool2d and its int8 one rejects channels-last input)."""
from __future__ import annotations

import torch

from ..._registry import Case, OpSpec, register_op
from .._requant.ref import CODE_RANGE
from . import DTYPES, OP, geometry, max_pool2d_int8, max_pool2d_int8_ref


def pool_case(name, shape, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, layout="contig",
              tags=(), extreme=None):
    def mk(dtype, device, gen):
        dt = dtype if dtype in DTYPES else torch.int8
        lo, hi = CODE_RANGE[dt]
        pad = 3 if layout == "strided" else 0
        x = torch.randint(lo, hi + 1, (*shape[:-1], shape[-1] + pad), generator=gen, dtype=dt)
        if extreme == "min":     # every tap at the dtype's minimum: the initial value must not leak
            x.fill_(lo)
        elif extreme == "max":
            x.view(-1)[::3] = hi
        if layout == "strided":
            x = x[..., 2:shape[-1] + 2]
        elif layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        return {"x": x.to(device), "kernel_size": kernel_size, "stride": stride, "padding": padding,
                "dilation": dilation, "ceil_mode": ceil_mode}
    return Case(name, mk, frozenset(tags))


def _cases():
    return [
        pool_case("1x3x7x5-k3-s2-p1", (1, 3, 7, 5), 3, 2, 1),
        pool_case("channels-last-2x5x9x7-k3-s2-p1", (2, 5, 9, 7), 3, 2, 1, layout="channels_last", tags={"layout"}),
        pool_case("2x4x9x8-k2", (2, 4, 9, 8), 2),
        pool_case("1x2x11x9-k3-s1-p1-d2", (1, 2, 11, 9), 3, 1, 1, 2),
        pool_case("1x3x8x7-k3-s2-ceil", (1, 3, 8, 7), 3, 2, 0, ceil_mode=True),
        pool_case("channels-last-1x70x6x5-k3x2-s1x2-p1x0-ceil", (1, 70, 6, 5), (3, 2), (1, 2), (1, 0), ceil_mode=True,
                  layout="channels_last", tags={"layout"}),
        pool_case("unbatched-3x5x5-k2-s1", (3, 5, 5), 2, 1),
        pool_case("strided-1x3x6x7-k3-s2-p1", (1, 3, 6, 7), 3, 2, 1, layout="strided", tags={"layout"}),
        pool_case("empty-0x3x5x5-k3", (0, 3, 5, 5), 3, tags={"empty"}),
        pool_case("extreme-min-1x4x5x5-k3-p1", (1, 4, 5, 5), 3, 1, 1, extreme="min", tags={"extreme"}),
        pool_case("extreme-max-channels-last-1x9x5x6-k2-p1", (1, 9, 5, 6), 2, 1, 1, layout="channels_last",
                  extreme="max", tags={"extreme"}),
    ]


def _bytes(kw):
    x = kw["x"]
    _, _, _, _, Ho, Wo = geometry(x, kw["kernel_size"], kw["stride"], kw["padding"], kw["dilation"], kw["ceil_mode"])
    return (x.numel() + x.numel() // (x.shape[-1] * x.shape[-2]) * Ho * Wo) * x.element_size()


def max_pool2d_int8_eager(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """What a user writes in plain PyTorch: max_pool2d on a float copy of the codes, back to the
    codes' dtype (torch's int8 max_pool2d fails on channels-last input; it has no int16 one)."""
    return torch.nn.functional.max_pool2d(x.float(), kernel_size, stride, padding, dilation, ceil_mode).to(x.dtype)


SPEC = register_op(OpSpec(
    name=OP, fn=max_pool2d_int8, ref=max_pool2d_int8_ref, eager=max_pool2d_int8_eager,
    kernels={"reference": f"tessera.ops.{OP}.ref", "cpu": f"tessera.ops.{OP}.cpu", "triton": f"tessera.ops.{OP}.triton"},
    cases=_cases(), grad_inputs=(), dtypes=DTYPES,
    bytes_fwd=_bytes, flops_fwd=lambda kw: 0,
    bench_cases=[pool_case(f"resnet18-stem-b{B}-64x112-k3-s2-p1", (B, 64, 112, 112), 3, 2, 1, layout="channels_last",
                           tags=() if B == 1 else {"extended"}) for B in (1, 8)],
    fuzz="test_max_pool2d_int8.py",
))
