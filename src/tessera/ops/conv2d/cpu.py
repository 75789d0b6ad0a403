"""conv2d native CPU launcher (kernels: conv2d.c).

Forward: x is widened/zero-padded into an fp32 NHWC buffer by ``tsr_conv2d_pack`` (skipped
for an unpadded channels-last fp32 x, which already is one, and for any channels-last x of a
depthwise conv: that kernel pads virtually and widens bf16 / fp16 as it loads), weights are
packed per group as [kh][kw][c_in][c_out rounded up to 16] (depthwise: [kh][kw][C]), then the
dense implicit-GEMM or the direct depthwise kernel writes y in x's memory format with the fused
epilogue.

Backward: z recomputed (fp32 NHWC) when an activation is fused (silu / gelu: the op hands
relu / relu6 over as an already masked dy); dz = dy * act'(z) packed fp32 NHWC; dweight and
dbias from dz and the padded x (depthwise: the unpadded x, read in place); dx = the forward
kernel on dz zero-inserted by the stride and padded by d*(k-1) - pad (depthwise stride 1: dz
itself, padded virtually), with the weight flipped in (kh, kw) and c_in/c_out swapped per group.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ... import _fastpath, _library, dispatch
from ..._library import SignatureCache, as_fp32_param, new_output
from ...backends import cpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("conv2d.c")
ACT_CODE = {None: 0, "relu": 1, "relu6": 2, "silu": 3, "gelu": 4}


def _lib():
    return cpu.library("conv2d", _SRC)


def _channels_last(x):
    return x.dim() == 4 and x.shape[1] > 1 and x.stride(1) == 1 and x.stride(3) > 1


def _out(x, n, c, h, w, dtype=None):
    """A kernel-written output in x's memory format, and its (n, c, h, w) strides."""
    dt = x.dtype if dtype is None else dtype
    if _channels_last(x):
        return new_output((n, h, w, c), dt, x.device).permute(0, 3, 1, 2)
    return new_output((n, c, h, w), dt, x.device)


def _pack(src, Hd, Wd, off_h, off_w, step_h=1, step_w=1, z=None, act=0):
    """fp32 NHWC [N, Hd, Wd, C] copy of the 4-D NCHW-indexed ``src`` (any strides/dtype) placed at
    (off + i*step), zeros elsewhere; times act'(z) when z (fp32 NHWC, src's sizes) is given."""
    N, C, H, W = src.shape
    dst = new_output((N, Hd, Wd, C), torch.float32, src.device)
    f = cpu.declare(_lib(), "tsr_conv2d_pack", "pillllllllpiplllllli")
    rc = f(cpu.ptr(src), cpu.DTYPE_CODE[src.dtype], N, C, H, W, *src.stride(), cpu.ptr(z), act,
           cpu.ptr(dst), Hd, Wd, off_h, off_w, step_h, step_w, cpu.threads_for(dst.numel()))
    cpu.check_rc(rc, "conv2d pack")
    return dst


def _padded_input(x, pads):
    t, b, l, r = pads
    N, C, H, W = x.shape
    if not any(pads) and x.dtype == torch.float32 and _channels_last(x) and \
            x.permute(0, 2, 3, 1).is_contiguous():
        return x.permute(0, 2, 3, 1)  # already fp32 NHWC, unpadded
    return _pack(x, H + t + b, W + l + r, t, l)


def _is_dw(weight, groups):
    return weight.shape[1] == 1 and weight.shape[0] == groups


def _pack_weight(weight, groups, transpose=False):
    """Dense: fp32 [G][KH][KW][K][COP] (K = c_in/g, COP = c_out/g rounded up to 16, zero-filled);
    transpose=True packs the input-gradient weight (kh, kw flipped, c_in and c_out swapped).
    Depthwise: fp32 [KH][KW][C] (flipped for the input gradient)."""
    cout, cing, KH, KW = weight.shape
    if _is_dw(weight, groups):
        w = weight.flip(2, 3) if transpose else weight
        return as_fp32_param(w.permute(2, 3, 0, 1)), 0
    w = weight.unflatten(0, (groups, cout // groups))        # [G][co][ci][kh][kw]
    w = w.flip(3, 4).permute(0, 3, 4, 1, 2) if transpose else w.permute(0, 3, 4, 2, 1)
    w = as_fp32_param(w)                                      # [G][KH][KW][K][M]
    m = w.shape[-1]
    cop = (m + 15) // 16 * 16
    if cop == m:
        return w, cop
    wp = new_output(tuple(w.shape[:-1]) + (cop,), torch.float32, w.device)
    wp.zero_()
    wp[..., :m] = w
    return wp, cop


def _packed_weight(weight, groups, transpose=False):
    """``_pack_weight`` memoised per weight tensor (``_library.per_tensor``): packing a large
    weight (a 512x512x3x3 gather-transpose) can cost more than the conv itself."""
    return _library.per_tensor(weight, ("conv2d", groups, transpose),
                               lambda: _pack_weight(weight, groups, transpose))


def _conv(xp, wp, cop, bias, out, groups, dw_kernel, K, M, KH, KW, stride, dilation, act, vpad=(0, 0)):
    """Run the forward kernel on the packed input xp [N, Hp, Wp, C] into out (N, G*M, OH, OW);
    ``vpad`` (top, left): the depthwise kernel's virtual zero padding of an unpadded xp.  xp is
    fp32, except that the depthwise kernel also reads a bf16 / fp16 xp (widened as loaded)."""
    N, Hp, Wp, C = xp.shape
    OH, OW = out.shape[2], out.shape[3]
    b = as_fp32_param(bias)
    th = cpu.threads_for(N * OH * OW * out.shape[1] * max(1, K) * KH * KW // 16)
    if dw_kernel:
        f = cpu.declare(_lib(), "tsr_conv2d_fwd_dw", "pillllpppillllllllllllllii")
        rc = f(cpu.ptr(xp), cpu.DTYPE_CODE[xp.dtype], N, Hp, Wp, C, cpu.ptr(wp), cpu.ptr(b), cpu.ptr(out),
               cpu.DTYPE_CODE[out.dtype], *out.stride(), OH, OW, KH, KW, *stride, *dilation, *vpad, act, th)
    else:
        f = cpu.declare(_lib(), "tsr_conv2d_fwd", "pllllplppilllllllllllllllii")
        rc = f(cpu.ptr(xp), N, Hp, Wp, C, cpu.ptr(wp), cop, cpu.ptr(b), cpu.ptr(out), cpu.DTYPE_CODE[out.dtype],
               *out.stride(), OH, OW, groups, K, M, KH, KW, *stride, *dilation, act, th)
    cpu.check_rc(rc, "conv2d forward")


def _out_hw(x, weight, stride, pads, dilation):
    H, W = x.shape[2], x.shape[3]
    KH, KW = weight.shape[2], weight.shape[3]
    OH = (H + pads[0] + pads[1] - dilation[0] * (KH - 1) - 1) // stride[0] + 1
    OW = (W + pads[2] + pads[3] - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    return OH, OW


class _Plan:
    """What a forward call's signature decides, derived once per signature (``_plan``): at small
    layers the Python glue (shapes, layouts, the packing decision) cost as much as the kernel."""
    __slots__ = ("N", "cout", "cing", "KH", "KW", "OH", "OW", "dwk", "cl", "nchw", "sub", "view", "key")

    def __init__(self, x, weight, stride, pads, dilation, groups):
        self.N = x.shape[0]
        self.cout, self.cing, self.KH, self.KW = weight.shape
        self.OH, self.OW = _out_hw(x, weight, stride, pads, dilation)
        self.dwk, self.cl = _is_dw(weight, groups), _channels_last(x)
        # the dispatch table's key: depthwise, pointwise (a GEMM over channels) or other dense
        self.key = "conv2d_dw" if self.dwk else "conv2d_1x1" if self.KH == self.KW == 1 else "conv2d"
        self.nchw = x.shape[1] > 1 and not self.cl       # the vendor rule's NCHW flag
        # a strided 1x1 conv reads every stride-th pixel: x is subsampled first (a view), so the
        # packing pass converts only those (it converted all of x: 0.37x eager on ResNet's downsample)
        self.sub = self.KH == self.KW == 1 and not any(pads) and tuple(stride) != (1, 1)
        if self.sub:
            x = x[:, :, ::stride[0], ::stride[1]]
        # a channels-last x read in place: by the dense kernel when fp32 and unpadded; by the
        # depthwise one in any dtype (it pads virtually and widens bf16 / fp16 as it loads)
        self.view = _channels_last(x) and x.permute(0, 2, 3, 1).is_contiguous() and \
            (self.dwk or (not any(pads) and x.dtype == torch.float32))


_PLANS = SignatureCache()


def _plan(x, weight, stride, pads, dilation, groups) -> _Plan:
    key = (x.shape, x.stride(), x.dtype, weight.shape, stride, pads, dilation, groups)
    p = _PLANS.lookup(key)
    return p if p is not None else _PLANS.store(key, _Plan(x, weight, stride, pads, dilation, groups))


def forward(x, weight, bias, stride, pads, dilation, groups, activation):
    p = _plan(x, weight, stride, pads, dilation, groups)
    N, cout, OH, OW = p.N, p.cout, p.OH, p.OW
    args = (x, weight, bias, stride, pads, dilation, groups, activation)
    if N and dispatch.use_vendor(p.key, x.dtype, N * OH * OW, cout,
                                 p.cing * p.KH * p.KW, nchw=p.nchw):
        y = dispatch.conv2d(x, weight, bias, stride, pads, dilation, groups, activation,
                            lambda s: _out(x, *s), p.cl)
        if activation in _VENDOR_REPLAYS:
            _learn(args, (p.key, "vendor"), 0)
        return y
    if p.cl:
        out = new_output((N, OH, OW, cout), x.dtype, x.device).permute(0, 3, 1, 2)
    else:
        out = new_output((N, cout, OH, OW), x.dtype, x.device)
    if N == 0:
        return out
    ks = stride
    if p.sub:
        x, ks = x[:, :, ::stride[0], ::stride[1]], (1, 1)
    # the depthwise kernel pads virtually: its x is the unpadded one
    xp = x.permute(0, 2, 3, 1) if p.view else _padded_input(x, (0, 0, 0, 0) if p.dwk else pads)
    wp, cop = _packed_weight(weight, groups)
    K, M = p.cing, cout // groups
    vpad = (pads[0], pads[2]) if p.dwk else (0, 0)
    _conv(xp, wp, cop, bias, out, groups, p.dwk, K, M, p.KH, p.KW, ks, dilation, ACT_CODE[activation], vpad)
    if not (p.view and p.sub) and not weight.is_inference():
        off = (0, 0) if p.dwk else (pads[0], pads[2])
        _learn(args, (p.key, "kernel"), 2 if p.dwk else 1, wp,
               (int(p.view), x.shape[2], x.shape[3], stride[0] if p.sub else 1, stride[1] if p.sub else 1,
                xp.shape[1], xp.shape[2], *off, cop, K, M, p.KH, p.KW, *ks, *dilation, *vpad, OH, OW, cout))
    return out


_VENDOR_REPLAYS = (None, "relu", "relu6")  # the vendor's activations applied in place (not fp32 silu / gelu)


def _learn(args, count_key, route, wp=None, geometry=()):
    """Tell the C++ twin of the op's body (csrc/fastpath_conv2d.h) what this call did, so a later
    call of the same signature replays it there (~2 us instead of ~20 us of Python glue).
    route: 0 the vendor call, 1 the dense kernel, 2 the depthwise one.  geometry (kernel routes):
    (x read in place, x's H and W (subsampled), the subsampling steps, the packed x's H and W and
    x's offset in it, cop, c_in/g, c_out/g, KH, KW, the kernel's stride and dilation, its virtual
    pads (top, left), OH, OW, C_out).  Not while a test places or poisons buffers (the twin never
    runs then) or without the extension (_fastpath.learner)."""
    learn = _fastpath.learner("conv2d")
    if learn is not None:
        learn(args + ("",), count_key, route, wp, geometry)


def _nhwc_f32(t):
    """t (N, C, H, W) as an fp32 NHWC tensor: a view when it already is one, else a packed copy."""
    return _padded_input(t, (0, 0, 0, 0))


def backward(dy, x, weight, bias, stride, pads, dilation, groups, activation, need_bias):
    N, C, H, W = x.shape
    cout, cing, KH, KW = weight.shape
    OH, OW = dy.shape[2], dy.shape[3]
    dwk = _is_dw(weight, groups)
    if N and dispatch.use_vendor("conv2d_dw_bwd" if dwk else "conv2d_bwd", x.dtype, N * OH * OW, cout,
                                 cing * KH * KW):
        return dispatch.conv2d_backward(dy, x, weight, bias, stride, pads, dilation, groups, activation,
                                        need_bias, lambda s: _out(x, *s), _channels_last(x))
    dx = _out(x, N, C, H, W)
    dw = new_output(tuple(weight.shape), torch.float32, x.device)
    db = new_output((cout,), torch.float32, x.device) if need_bias else None
    if N == 0:
        dw.zero_()
        if db is not None:
            db.zero_()
        return dx, dw, db
    if dwk:
        _backward_dw(dy, x, weight, bias, stride, pads, dilation, ACT_CODE[activation], dx, dw, db)
        return dx, dw, db
    lib, act = _lib(), ACT_CODE[activation]
    xp = _padded_input(x, pads)
    Hp, Wp = xp.shape[1], xp.shape[2]
    z = None
    if act:  # recompute the pre-activation sum in fp32 NHWC
        z = new_output((N, OH, OW, cout), torch.float32, x.device)
        wp, cop = _packed_weight(weight, groups)
        _conv(xp, wp, cop, bias, z.permute(0, 3, 1, 2), groups, False, cing, cout // groups, KH, KW, stride,
              dilation, 0)
    dz = _pack(dy, OH, OW, 0, 0, z=z, act=act)              # fp32 NHWC dz
    th = cpu.threads_for(dz.numel() * cing * KH * KW // 16)
    f = cpu.declare(lib, "tsr_conv2d_wgrad", "pllllpllllllllllllpi")
    rc = f(cpu.ptr(xp), N, Hp, Wp, C, cpu.ptr(dz), OH, OW, cout, groups, cing, cout // groups, KH, KW,
           *stride, *dilation, cpu.ptr(dw), th)
    cpu.check_rc(rc, "conv2d weight gradient")
    if db is not None:
        f = cpu.declare(lib, "tsr_conv2d_bgrad", "pllp")
        cpu.check_rc(f(cpu.ptr(dz), N * OH * OW, cout, cpu.ptr(db)), "conv2d bias gradient")
    _input_grad(dz, weight, groups, False, (H, W), stride, pads, dilation, dx)
    return dx, dw, db


def _input_grad(dz, weight, groups, dwk, hw, stride, pads, dilation, dx):
    """dx: dz (fp32 NHWC) correlated with the flipped weight, dz zero-inserted by the stride and
    offset by d*(k-1) - pad.  The depthwise kernel pads virtually, so at stride 1 it reads dz in
    place (no zero-inserted copy)."""
    cout, cing, KH, KW = weight.shape
    H, W = hw
    vh, vw = dilation[0] * (KH - 1) - pads[0], dilation[1] * (KW - 1) - pads[2]
    wt, cop = _packed_weight(weight, groups, transpose=True)
    if dwk and tuple(stride) == (1, 1) and vh >= 0 and vw >= 0:
        _conv(dz, wt, cop, None, dx, groups, True, cout // groups, cing, KH, KW, (1, 1), dilation, 0, (vh, vw))
        return
    dzz = _pack(dz.permute(0, 3, 1, 2), H + dilation[0] * (KH - 1), W + dilation[1] * (KW - 1), vh, vw,
                stride[0], stride[1])
    _conv(dzz, wt, cop, None, dx, groups, dwk, cout // groups, cing, KH, KW, (1, 1), dilation, 0)


def _backward_dw(dy, x, weight, bias, stride, pads, dilation, act, dx, dw, db):
    """Depthwise backward: every pass reads the unpadded x (in place when it is fp32 channels-last)
    with virtual zero padding; dweight and dbias come from one pass over dz."""
    N, C, H, W = x.shape
    KH, KW = weight.shape[2], weight.shape[3]
    OH, OW = dy.shape[2], dy.shape[3]
    xs = _nhwc_f32(x)
    z = None
    if act:  # recompute the pre-activation sum in fp32 NHWC
        z = new_output((N, OH, OW, C), torch.float32, x.device)
        wp, _ = _packed_weight(weight, C)
        _conv(xs, wp, 0, bias, z.permute(0, 3, 1, 2), C, True, 1, 1, KH, KW, stride, dilation, 0,
              (pads[0], pads[2]))
    dz = _nhwc_f32(dy) if not act else _pack(dy, OH, OW, 0, 0, z=z, act=act)   # fp32 NHWC dz
    th = cpu.threads_for(dz.numel() * KH * KW)
    f = cpu.declare(_lib(), "tsr_conv2d_wgrad_dw", "pllllpllllllllllppi")
    rc = f(cpu.ptr(xs), N, H, W, C, cpu.ptr(dz), OH, OW, KH, KW, *stride, *dilation, pads[0], pads[2],
           cpu.ptr(dw), cpu.ptr(db), th)
    cpu.check_rc(rc, "conv2d weight gradient")
    _input_grad(dz, weight, C, True, (H, W), stride, pads, dilation, dx)
