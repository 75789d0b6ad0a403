"""Integer-only 2-D convolution ``tessera.conv2d_int8`` (TFLite quantized conv, CMSIS-NN s8 / s16).

    acc[n, o, y, x] = sum_{c, ky, kx} (xp[n, c, y*sh + ky*dh, x*sw + kx*dw] - x_zp) * w[o, c, ky, kx] + bias[o]
    out             = requantize(acc, multiplier[o], shift[o], out_zp, qmin, qmax)

``xp`` is x padded with x_zp (a padding tap contributes exactly 0, TFLite's rule); c runs over
the C/groups channels of o's group.  s8: x int8 with zero point, w int8 symmetric per output
channel (its float scale is folded into the Q31 multiplier: there is no separate weight_scale),
bias int32, int32 accumulators (exact in int64, saturated to int32 with the bias), the int32
requantization (rounding "double" = TFLite, "single" = CMSIS-NN), int8 output; a fused ReLU /
ReLU6 is qmin / qmax.  s16: x int16 (zero point 0), w int8, bias int64, int64 accumulators and
TFLite's int64 requantization, int16 output.  Formulas: ``tessera.requantize``; golden vectors
tests/golden/gen_requant.py (a direct convolution written out in numpy).

Layouts: x NCHW or channels-last (any strides; the im2col gather reads them); the output has
x's memory format (channels-last x -> channels-last output, else contiguous NCHW).
Kernels: im2col into rows [N*Ho*Wo, C*kh*kw] (padding = x_zp), then per group one int GEMM of
ops/_qlinear_int8 (AVX512-VNNI VPDPBUSD / VPDPWSSD on CPU, ``tl.dot`` in Triton) with the
requantization (and the x_zp * sum w correction) as its epilogue pass; on CPU an int8 conv of one
group makes those rows inside the GEMM, a row chunk at a time (ops/_qlinear_int8/qi8_im2col.h),
never the whole matrix in memory.  Depthwise convs skip the
GEMM on CPU: a direct tap loop, and for 3-wide taps (MobileNet's layers) ops/_requant/dw_int8_k3.h
(3x3 as VPDPBUSD over four interleaved input rows, else fp32 FMAs, both exact).  No gradient.
Roofline: read x once and w once, write the output (1 or 2 bytes an element).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from ... import _checks
from ..._library import SignatureCache, contiguous, direct, plain
from ..._registry import select
from .._qlinear_int8 import MAX_K
from .._requant.ref import conv_forward as _ref_rows
from ..linear_int8_requant import X_DTYPES, check_bias, check_x_zero_point
from ..requantize import check_scales, check_shift_values, resolve_out

OP = "conv2d_int8"


def _pair(op, name, v, lo):
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)
    if not (isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                  for i in v)):
        raise TypeError(f"tessera.{op}: argument '{name}'={v!r} must be an int or a pair of ints")
    if min(v) < lo:
        raise ValueError(f"tessera.{op}: argument '{name}'={tuple(v)} must be >= {lo}")
    return tuple(v)


def geometry(x, weight, stride, padding, dilation, groups, op=OP):
    """(stride, padding, dilation, Ho, Wo), checked."""
    stride = _pair(op, "stride", stride, 1)
    dilation = _pair(op, "dilation", dilation, 1)
    kh, kw = weight.shape[2], weight.shape[3]
    if padding == "valid":
        padding = (0, 0)
    elif padding == "same":
        th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
        if stride != (1, 1) or th % 2 or tw % 2:
            raise ValueError(f"tessera.{op}: padding='same' needs stride 1 and an even dilation * (kernel - 1) "
                             f"(symmetric padding); got stride={stride}, kernel={(kh, kw)}, dilation={dilation}")
        padding = (th // 2, tw // 2)
    padding = _pair(op, "padding", padding, 0)
    H, W = x.shape[2], x.shape[3]
    Ho = (H + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    Wo = (W + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if Ho < 1 or Wo < 1:
        raise ValueError(f"tessera.{op}: argument 'x' ({_checks.describe(x)}) is smaller than the dilated kernel "
                         f"{(kh, kw)} (padding={padding}, dilation={dilation}): no output position")
    return stride, padding, dilation, Ho, Wo


def _check(x, x_zero_point, weight, bias, multiplier, shift, groups, check_values=True):
    _checks.tensor(OP, "x", x, dtypes=X_DTYPES)
    if x.dim() != 4:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must be 4-D [N, C, H, W]")
    check_x_zero_point(OP, x_zero_point, x)
    _checks.tensor(OP, "weight", weight, dtypes=(torch.int8,))
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"tessera.{OP}: argument 'groups'={groups!r} must be a positive int")
    C = x.shape[1]
    if weight.dim() != 4 or C % groups or weight.shape[0] % groups or weight.shape[1] * groups != C:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must be int8 [O, C/groups, "
                         f"kh, kw] with C = {C} (x.shape[1]) and O divisible by groups = {groups}")
    if weight.shape[0] == 0 or weight.shape[2] == 0 or weight.shape[3] == 0:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must not be empty")
    K = weight.shape[1] * weight.shape[2] * weight.shape[3]
    if K > MAX_K:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) has C/groups * kh * kw = "
                         f"{K} > {MAX_K} (the int32 accumulators' bound)")
    O = weight.shape[0]
    check_bias(OP, bias, O, x.dtype)
    check_scales(OP, multiplier, shift, O, torch.int32 if x.dtype == torch.int8 else torch.int64, "weight",
                 check_values)
    _checks.same_device(OP, "x", x, weight=weight, bias=bias, multiplier=multiplier, shift=shift)


def _channels_last(x):
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


# Signature caches: every check of _check / geometry (but the shift values) and of the public
# function's argument normalisation depends only on types, shapes, dtypes, devices and the plain
# arguments, so a signature that passed once is remembered: the checks cost ~40 us of a ~100 us
# call, a few ms of a quantized MobileNetV2's 52 convs.  Plain tensors only (a fake / functional
# tensor under tracing may carry symbolic sizes); types in the keys (True == 1 must not hit 1).
_CHECKED = SignatureCache()
_NORMALIZED = SignatureCache()


def _meta(t):
    return None if t is None else (t.shape, t.dtype, t.device)


def _checked_geometry(x, x_zero_point, weight, bias, multiplier, shift, stride, padding, dilation, groups):
    """_check, then geometry's (stride, padding, dilation, Ho, Wo), through _CHECKED."""
    key = None
    if plain(x, weight, multiplier, shift) and (bias is None or plain(bias)):
        key = (_meta(x), type(x_zero_point), x_zero_point, _meta(weight), _meta(bias), _meta(multiplier),
               _meta(shift), tuple(stride), tuple(padding), tuple(dilation), type(groups), groups)
        hit = _CHECKED.lookup(key)
        if hit is not None:
            check_shift_values(OP, shift, torch.int32 if x.dtype == torch.int8 else torch.int64)
            return hit
    _check(x, x_zero_point, weight, bias, multiplier, shift, groups)
    g = geometry(x, weight, stride, padding, dilation, groups)
    return g if key is None else _CHECKED.store(key, g)


def _impl(x: Tensor, x_zero_point: int, weight: Tensor, bias: Optional[Tensor], multiplier: Tensor, shift: Tensor,
          out_zero_point: int, stride: list[int], padding: list[int], dilation: list[int], groups: int, qmin: int,
          qmax: int, rounding: str, out_dtype: torch.dtype, backend: str) -> Tensor:
    stride, padding, dilation, Ho, Wo = _checked_geometry(x, x_zero_point, weight, bias, multiplier, shift, stride,
                                                          padding, dilation, groups)
    mod = select(SPEC, x.device, x.dtype, backend)
    rows = mod.forward(x, x_zero_point, contiguous(weight), contiguous(bias), contiguous(multiplier.reshape(-1)),
                       contiguous(shift.reshape(-1)), out_zero_point, qmin, qmax, rounding, out_dtype, stride,
                       padding, dilation, groups, Ho, Wo)
    y = rows.view(x.shape[0], Ho, Wo, weight.shape[0]).permute(0, 3, 1, 2)
    if _channels_last(x):
        return y
    # NCHW x: a contiguous NCHW output, through the backend's own transposing copy where it has one
    # (torch's int8 permute copy ran at ~1.5 GB/s on the cpu)
    to_nchw = getattr(mod, "rows_to_nchw", None)
    return y.contiguous() if to_nchw is None else to_nchw(rows, x.shape[0], Ho, Wo)


_op = torch.library.custom_op(f"tessera::{OP}", mutates_args=())(_impl)


@_op.register_fake
def _(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, stride, padding, dilation, groups, qmin,
      qmax, rounding, out_dtype, backend):
    _check(x, x_zero_point, weight, bias, multiplier, shift, groups, check_values=False)
    _, _, _, Ho, Wo = geometry(x, weight, stride, padding, dilation, groups)
    fmt = torch.channels_last if _channels_last(x) else torch.contiguous_format
    return torch.empty((x.shape[0], weight.shape[0], Ho, Wo), dtype=out_dtype, device=x.device, memory_format=fmt)


def _resolve(x, out_zero_point, qmin, qmax, rounding, out_dtype):
    _checks.tensor(OP, "x", x, dtypes=X_DTYPES)
    acc_like = x.new_empty(0, dtype=torch.int32 if x.dtype == torch.int8 else torch.int64)
    if out_dtype is None and x.dtype == torch.int16:
        out_dtype = torch.int16
    return resolve_out(acc_like, out_zero_point, qmin, qmax, rounding, out_dtype, OP)


def conv2d_int8(x: Tensor, x_zero_point: int, weight: Tensor, bias: Optional[Tensor], multiplier: Tensor,
                shift: Tensor, out_zero_point: int = 0, stride=1, padding: Union[int, tuple, str] = 0, dilation=1,
                groups: int = 1, qmin: Optional[int] = None, qmax: Optional[int] = None, *,
                rounding: Optional[str] = None, out_dtype: Optional[torch.dtype] = None,
                backend: Optional[str] = None) -> Tensor:
    """Integer-only conv2d: requantize(conv(x - x_zp, w) + bias) (module docstring)."""
    key = None
    if plain(x, weight):   # see _CHECKED
        key = (x.dtype, weight.shape, type(out_zero_point), out_zero_point, type(qmin), qmin, type(qmax), qmax,
               rounding, out_dtype, type(stride), stride, type(padding), padding, type(dilation), dilation,
               type(groups), groups, backend)
        hit = _NORMALIZED.lookup(key)   # None too for an unhashable argument (a list): never cached
        if hit is not None and plain(multiplier, shift) and (bias is None or plain(bias)):
            return direct(_op, _impl, x, weight, bias, multiplier, shift)(x, x_zero_point, weight, bias, multiplier,
                                                                          shift, out_zero_point, *hit)
    _checks.python_types(OP, {"x": x, "weight": weight, "bias": bias, "multiplier": multiplier, "shift": shift})
    for name, t in (("weight", weight), ("multiplier", multiplier), ("shift", shift)):
        if t is None:
            raise TypeError(f"tessera.{OP}: argument '{name}' must be a torch.Tensor, got NoneType")
    out_dtype, qmin, qmax, rounding = _resolve(x, out_zero_point, qmin, qmax, rounding, out_dtype)
    if isinstance(padding, str):
        _checks.choice(OP, "padding", padding, ("same", "valid"))
        _checks.tensor(OP, "weight", weight, dtypes=(torch.int8,))
        if weight.dim() != 4:
            raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must be 4-D")
        padding = geometry(x, weight, stride, padding, dilation, groups)[1]
    stride, padding, dilation = (list(_pair(OP, n, v, lo)) for n, v, lo in
                                 (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)))
    rest = (stride, padding, dilation, groups, qmin, qmax, rounding, out_dtype, _checks.backend_arg(OP, backend))
    if key is not None:
        _NORMALIZED.store(key, rest)
    return direct(_op, _impl, x, weight, bias, multiplier, shift)(x, x_zero_point, weight, bias, multiplier, shift,
                                                                  out_zero_point, *rest)


def _ref(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point=0, stride=1, padding=0, dilation=1,
         groups=1, qmin=None, qmax=None, *, rounding=None, out_dtype=None):
    out_dtype, qmin, qmax, rounding = _resolve(x, out_zero_point, qmin, qmax, rounding, out_dtype)
    stride, padding, dilation, Ho, Wo = geometry(x, weight, stride, padding, dilation, groups)
    rows = _ref_rows(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding,
                     out_dtype, stride, padding, dilation, groups, Ho, Wo)
    return rows.view(x.shape[0], Ho, Wo, weight.shape[0]).permute(0, 3, 1, 2).contiguous()


from .spec import SPEC  # noqa: E402  (cases and benchmark rows; registers the op)
