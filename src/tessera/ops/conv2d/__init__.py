"""2-D convolution with a fused bias + activation epilogue (``tessera.conv2d``).

    z[n, o, i, j] = bias[o] + sum_{c in group(o), kh, kw}
                    x_pad[n, c, i*sh + kh*dh, j*sw + kw*dw] * weight[o, c - g0(o), kh, kw]
    y = act(z),   act in {None, "relu", "relu6", "silu", "gelu" (exact, erf)}

Arguments as ``F.conv2d`` (stride / dilation an int or a pair; padding an int, a pair,
``"valid"`` or ``"same"``; ``groups`` including depthwise ``groups == C``) plus the epilogue.
``"same"`` pads ``d*(k-1)`` per dim in total with the odd extra on the bottom/right, as
PyTorch (it requires stride 1).  The memory format of ``x`` decides the output's: a
channels-last ``x`` gives a channels-last ``y``, anything else a contiguous NCHW ``y``.

Numerics: products accumulate in fp32 for every dtype (fp16/bf16 inputs are widened on
load), the epilogue runs on the fp32 sum, and the result is rounded once (round to
nearest even) to x's dtype.  weight and bias must have x's dtype.

Backward (dx, dweight, dbias): dz = dy * act'(z).  relu / relu6 read that mask from the
saved output y (as eager's relu does; for fp16/bf16 y, from the rounded value); silu / gelu
recompute z in fp32 with the forward kernel (only x is kept for them).  dx is the forward
kernel run on dz (zero-inserted for strides, padded by d*(k-1) - pad) with the weight
flipped and transposed per group; dweight correlates x with dz; dbias sums dz.  dweight/dbias
accumulate in fp32 and are cast to weight's dtype.

Roofline: forward reads x and weight and writes y; FLOPs 2 * N*OH*OW * Cout * Cin/g * KH*KW.
Depthwise convs are memory-bound, dense ones compute-bound (fp32 FMA peak).
Sources: the convolution arithmetic of Dumoulin & Visin (2016) for the transposed-conv
gradient; the NHWC implicit-GEMM formulation used by oneDNN / cuDNN (written here from
the formula, no code taken).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import SignatureCache, direct, plain
from ..._registry import Case, OpSpec, bf16_compute_if, register_op, select
from ... import _cases as C
from .ref import ACTIVATIONS, conv2d_eager, conv2d_ref, is_channels_last

OP = "conv2d"


def _pair(name, v, min_value):
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, (tuple, list)) and len(v) == 2
                                                          and all(isinstance(e, int) and not isinstance(e, bool)
                                                                  for e in v))):
        raise TypeError(f"tessera.{OP}: argument '{name}' must be an int or a pair of ints, got {v!r}")
    p = (v, v) if isinstance(v, int) else tuple(v)
    if min(p) < min_value:
        raise ValueError(f"tessera.{OP}: argument '{name}'={v!r} must be >= {min_value}")
    return p


def normalize(x_shape, w_shape, stride, padding, dilation):
    """(stride pair, pads (top, bottom, left, right), dilation pair), checked."""
    s = _pair("stride", stride, 1)
    d = _pair("dilation", dilation, 1)
    if isinstance(padding, str):
        if padding == "valid":
            return s, (0, 0, 0, 0), d
        if padding != "same":
            raise ValueError(f"tessera.{OP}: argument 'padding'={padding!r} is not supported; "
                             f"expected 'same', 'valid', an int or a pair of ints")
        if s != (1, 1):
            raise ValueError(f"tessera.{OP}: argument 'padding'='same' needs stride 1, got stride={stride!r}")
        th, tw = d[0] * (w_shape[2] - 1), d[1] * (w_shape[3] - 1)
        return s, (th // 2, th - th // 2, tw // 2, tw - tw // 2), d
    p = _pair("padding", padding, 0)
    return s, (p[0], p[0], p[1], p[1]), d


def out_hw(x_shape, w_shape, s, pads, d):
    oh = (x_shape[2] + pads[0] + pads[1] - d[0] * (w_shape[2] - 1) - 1) // s[0] + 1
    ow = (x_shape[3] + pads[2] + pads[3] - d[1] * (w_shape[3] - 1) - 1) // s[1] + 1
    return oh, ow


_CHECKED = SignatureCache()     # signature of an argument set that passed _check -> (oh, ow)
_NORMALIZED = SignatureCache()  # the public function's argument signature -> its normalised arguments


def _check(x, weight, bias, stride, pads, dilation, groups, activation):
    """Validate one call; returns the output's (oh, ow).  Every test below depends only on the
    signature (types, shapes, dtypes, devices, the conv's parameters), so a signature that passed
    once is remembered: the checks cost ~10 us a call, a sixth of a small layer's oneDNN time."""
    key = None
    # plain tensors and parameters only: fake / functional tensors under tracing may carry
    # symbolic sizes, which must not be hashed into a key
    if plain(x, weight) and (bias is None or plain(bias)):
        key = (x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device,
               None if bias is None else (bias.shape, bias.dtype, bias.device),
               stride, pads, dilation, groups, activation)
        hit = _CHECKED.lookup(key)
        if hit is not None:
            return hit
    out = _check_uncached(x, weight, bias, stride, pads, dilation, groups, activation)
    return out if key is None else _CHECKED.store(key, out)


def _check_uncached(x, weight, bias, stride, pads, dilation, groups, activation):
    _checks.tensor(OP, "x", x)
    _checks.tensor(OP, "weight", weight)
    if x.dim() != 4:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must be 4-D (N, C, H, W)")
    if weight.dim() != 4 or weight.numel() == 0:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) must be a non-empty 4-D "
                         f"(C_out, C_in/groups, KH, KW) tensor")
    _checks.same_dtype(OP, "x", x, "weight", weight)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"tessera.{OP}: argument 'groups'={groups!r} must be an int >= 1")
    cout = weight.shape[0]
    if x.shape[1] != weight.shape[1] * groups or cout % groups:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) does not fit 'x' "
                         f"({_checks.describe(x)}) with groups={groups}: expected C_in/groups = "
                         f"{x.shape[1] // groups if x.shape[1] % groups == 0 else '?'} in dim 1 and C_out "
                         f"divisible by groups")
    if bias is not None:
        _checks.tensor(OP, "bias", bias)
        if bias.dim() != 1 or bias.shape[0] != cout:
            raise ValueError(f"tessera.{OP}: argument 'bias' ({_checks.describe(bias)}) must be 1-D of size "
                             f"{cout} (C_out of 'weight')")
        _checks.same_dtype(OP, "x", x, "bias", bias)
    _checks.same_device(OP, "x", x, weight=weight, bias=bias)
    _checks.choice(OP, "activation", activation, ACTIVATIONS)
    oh, ow = out_hw(x.shape, weight.shape, stride, pads, dilation)
    if oh < 1 or ow < 1:
        raise ValueError(f"tessera.{OP}: argument 'weight' ({_checks.describe(weight)}) with dilation={dilation} "
                         f"is larger than the padded input 'x' ({_checks.describe(x)}, pads {pads}): "
                         f"output would be {oh}x{ow}")
    return oh, ow


def _out_like(x, shape, dtype=None):
    """An empty tensor of ``shape`` in x's memory format (what every backend's forward returns)."""
    n, c, h, w = shape
    dt = x.dtype if dtype is None else dtype
    if is_channels_last(x):
        return x.new_empty((n, h, w, c), dtype=dt).permute(0, 3, 1, 2)
    return x.new_empty(shape, dtype=dt)


def _conv2d_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: list[int], pads: list[int],
                 dilation: list[int], groups: int, activation: Optional[str], backend: str) -> Tensor:
    _check(x, weight, bias, tuple(stride), tuple(pads), tuple(dilation), groups, activation)
    mod = select(SPEC, x.device, x.dtype, backend)
    return mod.forward(x, weight, bias, tuple(stride), tuple(pads), tuple(dilation), groups, activation)


_conv2d = torch.library.custom_op("tessera::conv2d", mutates_args=())(_conv2d_impl)


@_conv2d.register_fake
def _(x, weight, bias, stride, pads, dilation, groups, activation, backend):
    oh, ow = _check(x, weight, bias, tuple(stride), tuple(pads), tuple(dilation), groups, activation)
    return _out_like(x, (x.shape[0], weight.shape[0], oh, ow))


def _conv2d_backward_impl(dy: Tensor, x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: list[int],
                          pads: list[int], dilation: list[int], groups: int, activation: Optional[str],
                          need_bias: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    mod = select(SPEC, x.device, x.dtype, backend)
    dx, dw, db = mod.backward(dy, x, weight, bias, tuple(stride), tuple(pads), tuple(dilation), groups,
                              activation, need_bias)
    db = x.new_empty(0) if db is None else db.to(weight.dtype)
    return dx, dw.to(weight.dtype), db


_conv2d_backward = torch.library.custom_op("tessera::conv2d_backward", mutates_args=())(_conv2d_backward_impl)


@_conv2d_backward.register_fake
def _(dy, x, weight, bias, stride, pads, dilation, groups, activation, need_bias, backend):
    db = weight.new_empty((weight.shape[0],)) if need_bias else x.new_empty(0)
    return _out_like(x, x.shape), weight.new_empty(weight.shape), db


_MASK_ACTS = ("relu", "relu6")


def _setup(ctx, inputs, output):
    x, weight, bias, stride, pads, dilation, groups, activation, backend = inputs
    ctx.args = (stride, pads, dilation, groups, activation)
    ctx.has_bias, ctx.backend = bias is not None, backend
    # relu / relu6: act'(z) is a mask that y itself gives (y > 0 iff z > 0; 0 < y < 6 iff 0 < z < 6),
    # so y is kept, as eager's relu keeps its output, and the backward needs no recompute of z
    # (a whole forward conv: a third of a dense layer's backward)
    ctx.save_for_backward(x, weight, bias, output if activation in _MASK_ACTS else None)


def _backward(ctx, dy):
    x, weight, bias, y = ctx.saved_tensors
    stride, pads, dilation, groups, activation = ctx.args
    if y is not None:
        # dz = dy where the activation passes, else 0 (PyTorch's threshold / hardtanh backward);
        # for fp16/bf16 y the mask is read from the rounded output, as eager reads relu's
        dy = (torch.ops.aten.threshold_backward(dy, y, 0.0) if activation == "relu"
              else torch.ops.aten.hardtanh_backward(dy, y, 0.0, 6.0))
        activation = None
    # a plain backward (no create_graph, no tracing) skips the dispatcher like the forward: the
    # custom op's overhead was ~140 us a call, a quarter of a small bf16 layer's backward
    dx, dw, db = direct(_conv2d_backward, _conv2d_backward_impl, dy, x, weight, bias)(
        dy, x, weight, bias, stride, pads, dilation, groups, activation, ctx.has_bias, ctx.backend)
    return dx, dw, (db if ctx.has_bias else None), None, None, None, None, None, None


_conv2d.register_autograd(_backward, setup_context=_setup)


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0, dilation=1,
           groups: int = 1, activation: Optional[str] = None, *, backend: Optional[str] = None) -> Tensor:
    """``act(F.conv2d(x, weight, bias, stride, padding, dilation, groups))`` in one kernel; the output
    takes x's memory format (channels-last in, channels-last out)."""
    key = None
    if plain(x, weight) and (bias is None or plain(bias)):
        # the normalisation below depends only on these (types in the key: True must not hit 1)
        key = (x.dim(), weight.shape, type(stride), stride, type(padding), padding, type(dilation), dilation,
               type(groups), groups, activation, backend)
        hit = _NORMALIZED.lookup(key)   # None too for an unhashable argument (a list): never cached
        if hit is not None:
            return direct(_conv2d, _conv2d_impl, x, weight, bias)(x, weight, bias, *hit)
    _checks.python_types(OP, {"x": x, "weight": weight, "bias": bias})
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"tessera.{OP}: argument 'weight' must be a torch.Tensor, got {type(weight).__name__}")
    for name, t in (("x", x), ("weight", weight)):
        if t.dim() != 4:
            raise ValueError(f"tessera.{OP}: argument '{name}' ({_checks.describe(t)}) must be 4-D")
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"tessera.{OP}: argument 'activation' must be a str or None, got {type(activation).__name__}")
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise TypeError(f"tessera.{OP}: argument 'groups' must be an int, got {type(groups).__name__}")
    s, pads, d = normalize(x.shape, weight.shape, stride, padding, dilation)
    rest = (list(s), list(pads), list(d), groups, activation, _checks.backend_arg(OP, backend))
    if key is not None:
        _NORMALIZED.store(key, rest)
    return direct(_conv2d, _conv2d_impl, x, weight, bias)(x, weight, bias, *rest)


# ---------------------------------------------------------------- spec: cases, roofline

def _build(name, xs, ws, tags=(), bias=True, layout="nchw", scale=1.0, **conv):
    """A case: x of shape ``xs`` in ``layout`` ("nchw", "cl" channels-last, "view" a strided NCHW
    view, "clview" a strided channels-last view), weight ``ws``, optional bias, conv kwargs."""
    def mk(dtype, device, gen):
        if layout == "nchw":
            x = C.make(xs, dtype, device, gen, scale=scale)
        elif layout == "cl":
            x = C.make(xs, dtype, device, gen, scale=scale).contiguous(memory_format=torch.channels_last)
        elif layout == "view":  # every dim strided, nonzero offset: channel and width slices of a bigger NCHW
            n, c, h, w = xs
            x = C.make((n, c + 2, h, 2 * w + 1), dtype, device, gen, scale=scale)[:, 1:c + 1, :, 1::2]
        else:  # "clview": a width-strided, channel-sliced view of a channels-last buffer
            n, c, h, w = xs
            big = C.make((n, c + 3, h, 2 * w), dtype, device, gen, scale=scale).contiguous(
                memory_format=torch.channels_last)
            x = big[:, 2:c + 2, :, ::2]
        kw = {"x": x, "weight": C.make(ws, dtype, device, gen, scale=(xs[1] // conv.get("groups", 1)
                                                                       * ws[2] * ws[3]) ** -0.5)}
        kw["bias"] = C.make(ws[:1], dtype, device, gen) if bias else None
        kw.update(conv)
        return kw
    return Case(name, mk, frozenset(tags))


def _cases():
    return [
        # smallest case with every argument: tests/test_errors.py breaks it (kernel width == input width,
        # so a weight one wider is an error, not a valid bigger conv)
        _build("base-1x2x5x3-k3", (1, 2, 5, 3), (4, 2, 3, 3)),
        _build("13x13-s2-d2-silu", (1, 4, 13, 13), (6, 4, 3, 3), stride=2, dilation=2, padding=2,
               activation="silu"),
        _build("1x1-spatial-relu", (3, 5, 1, 1), (7, 5, 1, 1), activation="relu"),
        # the same arguments at another shape: one dynamic-shape graph serves both (test_compile_export)
        _build("k3-7x6-relu", (2, 3, 7, 6), (5, 3, 3, 3), activation="relu"),
        _build("pointwise-cl-relu6", (2, 16, 7, 5), (33, 16, 1, 1), layout="cl", activation="relu6"),
        # a strided 1x1 (ResNet's downsample): the kernels subsample x first, odd sizes leave a last column
        _build("pointwise-s2-odd", (2, 6, 7, 9), (5, 6, 1, 1), stride=2),
        _build("pointwise-s21-view", (1, 8, 5, 7), (4, 8, 1, 1), {"layout"}, layout="view", stride=(2, 1)),
        _build("dw-13-s2-cl-relu6", (1, 24, 13, 13), (24, 1, 3, 3), layout="cl", groups=24, stride=2,
               padding=1, activation="relu6"),
        # 16+3 channels, a full 8-pixel interior tile: the depthwise kernel's 3-tap fast path and tails
        _build("dw-k3-c19-w21-cl", (1, 19, 3, 21), (19, 1, 3, 3), layout="cl", groups=19, padding=1,
               activation="relu6"),
        _build("dw-same-k5-w13-silu", (2, 17, 4, 13), (17, 1, 5, 5), groups=17, padding="same", activation="silu"),
        _build("groups3-s12-p12-gelu", (1, 6, 7, 9), (12, 2, 3, 3), groups=3, stride=(1, 2), padding=(1, 2),
               activation="gelu"),
        _build("dw-mult2-valid", (1, 4, 7, 7), (8, 1, 3, 3), groups=4, padding="valid", bias=False),
        _build("same-k4x2-d12", (1, 3, 7, 8), (4, 3, 4, 2), padding="same", dilation=(1, 2), bias=False),
        _build("empty-batch", (0, 3, 7, 7), (4, 3, 3, 3), {"empty"}, padding=1),
        _build("view-nchw", (2, 5, 7, 6), (6, 5, 3, 3), {"layout"}, layout="view", padding=1, stride=2),
        _build("view-cl-dw-w19", (1, 16, 4, 19), (16, 1, 3, 3), {"layout"}, layout="clview", groups=16,
               padding=1),
        _build("view-cl-dense", (1, 6, 5, 7), (20, 6, 3, 3), {"layout"}, layout="clview", padding=1,
               activation="silu"),
        _build("big-values-relu", (1, 3, 7, 7), (4, 3, 3, 3), {"extreme"}, scale=50.0, padding=1,
               activation="relu"),
        _build("resnet-64x14", (2, 64, 14, 14), (64, 64, 3, 3), {"large"}, layout="cl", padding=1,
               activation="relu"),
    ]


def _geometry(kw):
    s, pads, d = normalize(kw["x"].shape, kw["weight"].shape, kw.get("stride", 1), kw.get("padding", 0),
                           kw.get("dilation", 1))
    return out_hw(kw["x"].shape, kw["weight"].shape, s, pads, d)


def _flops(kw):
    x, w = kw["x"], kw["weight"]
    oh, ow = _geometry(kw)
    return 2 * x.shape[0] * oh * ow * w.numel()


def _bytes_fwd(kw):
    x, w = kw["x"], kw["weight"]
    oh, ow = _geometry(kw)
    return (x.numel() + w.numel() + x.shape[0] * w.shape[0] * oh * ow) * x.element_size()


def _bytes_bwd(kw):
    x, w = kw["x"], kw["weight"]
    oh, ow = _geometry(kw)
    # read dy, x, weight; write dx, dweight
    return (2 * x.numel() + 2 * w.numel() + x.shape[0] * w.shape[0] * oh * ow) * x.element_size()


def _bound(kw):
    return "memory" if kw["weight"].shape[1] == 1 else "compute"


def _bench_cases():
    """ResNet-18 and MobileNetV2 layer shapes (written out; torchvision is not needed), batch 1 and 8."""
    shapes = [  # name, Cin, H, Cout, k, stride, groups, activation
        ("r18-conv1-7x7s2", 3, 224, 64, 7, 2, 1, "relu"),
        ("r18-l1-3x3-64", 64, 56, 64, 3, 1, 1, "relu"),
        ("r18-l2-3x3-128", 128, 28, 128, 3, 1, 1, "relu"),
        ("r18-l3-3x3-256", 256, 14, 256, 3, 1, 1, "relu"),
        ("r18-l4-3x3-512", 512, 7, 512, 3, 1, 1, "relu"),
        ("r18-ds-1x1s2-128", 64, 56, 128, 1, 2, 1, None),
        ("mv2-dw-3x3-32x112", 32, 112, 32, 3, 1, 32, "relu6"),
        ("mv2-dw-3x3s2-96x112", 96, 112, 96, 3, 2, 96, "relu6"),
        ("mv2-dw-3x3-144x56", 144, 56, 144, 3, 1, 144, "relu6"),
        ("mv2-dw-3x3-384x14", 384, 14, 384, 3, 1, 384, "relu6"),
        ("mv2-dw-3x3-960x7", 960, 7, 960, 3, 1, 960, "relu6"),
        ("mv2-pw-1x1-144to24x56", 144, 56, 24, 1, 1, 1, None),
        ("mv2-pw-1x1-64to384x14", 64, 14, 384, 1, 1, 1, "relu6"),
        ("mv2-pw-1x1-960to160x7", 960, 7, 160, 1, 1, 1, None),
    ]
    out = []
    for batch in (1, 8):
        for name, cin, h, cout, k, s, g, act in shapes:
            tags = {"extended"} if batch == 8 and h * h * cin >= 56 * 56 * 96 else set()
            out.append(_build(f"{name}-b{batch}", (batch, cin, h, h), (cout, cin // g, k, k), tags, layout="cl",
                              stride=s, padding=k // 2, groups=g, activation=act))
    return out


SPEC = register_op(OpSpec(
    name=OP, fn=conv2d, ref=conv2d_ref, eager=conv2d_eager,
    kernels={"reference": "tessera.ops.conv2d.ref", "cpu": "tessera.ops.conv2d.cpu",
             "triton": "tessera.ops.conv2d.triton"},
    cases=_cases(), grad_inputs=("x", "weight", "bias"),
    bytes_fwd=_bytes_fwd, bytes_bwd=_bytes_bwd, flops_fwd=_flops, flops_bwd=lambda kw: 2 * _flops(kw),
    bound=_bound, bench_cases=_bench_cases(), fuzz="test_conv2d.py",
    # bf16 x: oneDNN's bf16 conv (AMX on Sapphire Rapids) is the route dispatch takes for dense
    # layers, so a bf16 row's ceiling is the bf16 peak (against the FMA peak it read up to 437 %)
    compute_dtype=bf16_compute_if("x"),
    # fp32 sums of Cin/g*KH*KW (forward, dx) and N*OH*OW (dweight, dbias) products in a different
    # order than the float64 reference: atol scaled by ~sqrt(terms) over the default 1e-5
    fp32_tol={0: (1e-5, 1e-4)},
    fp32_grad_tol={"x": (1e-5, 1e-4), "weight": (1e-5, 3e-4), "bias": (1e-5, 3e-4)},
))
