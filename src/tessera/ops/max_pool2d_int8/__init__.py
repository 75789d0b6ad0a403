"""Max pooling of integer codes ``tessera.max_pool2d_int8`` (TFLite's quantized MAX_POOL_2D): the
pooling layer of a quantized CNN (ResNet's stem), run on the int8 / int16 codes themselves.

    y[n, c, oy, ox] = max over the window's taps inside x of x[n, c, oy*s - p + ky*d, ox*s - p + kx*d]

Max commutes with dequantization (an increasing map code -> value), so pooling the codes is exact
and the output keeps x's scale and zero point; padded taps never win (PyTorch's -inf padding).
Arguments as ``torch.nn.functional.max_pool2d`` (kernel_size, stride = kernel_size when None,
padding <= kernel_size / 2, dilation, ceil_mode; an int or a pair each; no return_indices).
x is [N, C, H, W] or [C, H, W]; the output keeps x's memory format (channels-last x: channels-last
y).  Kernels: the CPU runs channels-last inputs as a max over whole rows of C codes per tap
(vectorised), any other layout tap by tap.  No gradient (integer op).  Roofline: read x (the
windows overlap, so at least once), write y.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, new_output
from ..._registry import select
from ..conv2d_int8 import _pair

OP = "max_pool2d_int8"
DTYPES = (torch.int8, torch.int16)


def geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    """((kh, kw), stride, padding, dilation, Ho, Wo), checked as PyTorch's max_pool2d does."""
    k = _pair(OP, "kernel_size", kernel_size, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else \
        _pair(OP, "stride", stride, 1)
    p = _pair(OP, "padding", padding, 0)
    d = _pair(OP, "dilation", dilation, 1)
    if not isinstance(ceil_mode, bool):
        raise TypeError(f"tessera.{OP}: argument 'ceil_mode' must be a bool, got {type(ceil_mode).__name__}")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ValueError(f"tessera.{OP}: argument 'padding'={p} must be at most half the kernel size {k}")
    H, W = x.shape[-2], x.shape[-1]
    out = []
    for n, kk, ss, pp, dd in ((H, k[0], s[0], p[0], d[0]), (W, k[1], s[1], p[1], d[1])):
        span = n + 2 * pp - dd * (kk - 1) - 1
        o = (span + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (o - 1) * ss >= n + pp:   # the last window must start inside x or its left padding
            o -= 1
        out.append(o)
    if out[0] < 1 or out[1] < 1:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) is smaller than the dilated kernel "
                         f"{k} (padding={p}, dilation={d}): no output position")
    return k, s, p, d, out[0], out[1]


def _check(x):
    _checks.tensor(OP, "x", x, dtypes=DTYPES, min_dim=3)
    if x.dim() > 4:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must be [N, C, H, W] or [C, H, W]")


def channels_last(x: Tensor) -> bool:
    """The output's layout rule: channels-last exactly when x is (and not also contiguous)."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def output(x: Tensor, Ho: int, Wo: int, channels_last: bool) -> Tensor:
    """The backends' output buffer in x's format (new_output: poisoned / fenced under test)."""
    N, C = x.shape[:2]
    if channels_last:
        return new_output((N, Ho, Wo, C), x.dtype, x.device).permute(0, 3, 1, 2)
    return new_output((N, C, Ho, Wo), x.dtype, x.device)


def _max_pool2d_int8_impl(x: Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
                          dilation: list[int], ceil_mode: bool, backend: str) -> Tensor:
    _check(x)
    k, s, p, d, Ho, Wo = geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    x4 = x if x.dim() == 4 else x.unsqueeze(0)
    mod = select(SPEC, x.device, x.dtype, backend)
    y = mod.forward(x4, k, s, p, d, ceil_mode, Ho, Wo, channels_last(x4))
    return y if x.dim() == 4 else y.squeeze(0)


_max_pool2d_int8 = torch.library.custom_op("tessera::max_pool2d_int8", mutates_args=())(_max_pool2d_int8_impl)


@_max_pool2d_int8.register_fake
def _(x, kernel_size, stride, padding, dilation, ceil_mode, backend):
    _check(x)
    _, _, _, _, Ho, Wo = geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    if channels_last(x):
        return x.new_empty((x.shape[0], Ho, Wo, x.shape[1])).permute(0, 3, 1, 2)
    return x.new_empty((*x.shape[:-2], Ho, Wo))


def _as_list(name, v, default=None):
    """An int or a pair as the schema's int list ([] for stride=None: the kernel size)."""
    if v is None:
        return [] if default is None else default
    if isinstance(v, int) and not isinstance(v, bool):
        return [v, v]
    if isinstance(v, (tuple, list)):
        return list(v)
    raise TypeError(f"tessera.{OP}: argument '{name}'={v!r} must be an int or a pair of ints")


def max_pool2d_int8(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, *,
                    backend: Optional[str] = None) -> Tensor:
    """Max pooling of int8 / int16 codes, exact (module docstring)."""
    _checks.python_types(OP, {"x": x})
    _check(x)
    args = (_as_list("kernel_size", kernel_size), _as_list("stride", stride), _as_list("padding", padding),
            _as_list("dilation", dilation))
    geometry(x, *args, ceil_mode)
    return direct(_max_pool2d_int8, _max_pool2d_int8_impl, x)(x, *args, ceil_mode, _checks.backend_arg(OP, backend))


def max_pool2d_int8_ref(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """PyTorch's max_pool2d on a float64 copy of the codes (|code| <= 2^15: exact), in x's format."""
    _check(x)
    geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    y = torch.nn.functional.max_pool2d(x.cpu().double(), kernel_size, stride, padding, dilation, ceil_mode)
    y = y.to(x.dtype)
    return (y.contiguous(memory_format=torch.channels_last) if channels_last(x) else y.contiguous()).to(x.device)


from .spec import SPEC  # noqa: E402  (cases and benchmark rows; registers the op)
