"""Native CPU launchers of the integer-only pipeline (kernels: requant.c, and the int8 GEMM of
ops/_qlinear_int8/qlinear_int8.c: AVX512-VNNI VPDPBUSD / VPDPWSSD micro-kernels).

linear_int8_requant and conv2d_int8 are one int GEMM on the raw int8 (int16) activations plus a
per-channel int64 offset (bias - x_zp * sum_k w) folded into the requantization: exact, and the
GEMM needs no (x - zp) copy that would not fit int8.  The GEMM requantizes its own output
(tsr_qi8_mm_rq, with csrc/tessera_requant.h's arithmetic): the int32 accumulators never make a
round trip through memory.  conv2d_int8 is im2col (padding taps hold x_zp) into that GEMM, one
GEMM per group; for int8 x of one group the GEMM makes the im2col rows itself, chunk by chunk
(conv_requant: tsr_qi8_conv_rq), rather than read a gathered matrix.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ... import _fastpath
from ..._library import contiguous, new_output, per_tensor
from ...backends import cpu
from .._qlinear_int8.cpu import conv_requant, int_mm_requant, pack_bytes, pack_weight
from .ref import DTYPES, SHIFT_RANGE  # noqa: F401  (DTYPES: the backend module's)

_SRC = Path(__file__).with_name("requant.c")
ROUNDING = {"double": 0, "single": 1}


def _lib():
    return cpu.library("requant", _SRC)


def requant_into(acc, mult, shift, off, zp, qmin, qmax, rounding, out):
    """acc [M, C] int32/int64 row view -> out [M, C] int8/int16 row view (any row strides)."""
    M, C = acc.shape
    if M == 0 or C == 0:
        return out
    f = cpu.declare(_lib(), "tsr_requant", "plipplpllllliplii")
    rc = f(cpu.ptr(acc), acc.stride(0), int(acc.dtype == torch.int64), cpu.ptr(mult), cpu.ptr(shift),
           int(mult.numel() > 1), cpu.ptr(off), M, C, zp, qmin, qmax, ROUNDING[rounding], cpu.ptr(out),
           out.stride(0), int(out.dtype == torch.int16), cpu.threads_for(M * C))
    cpu.check_rc(rc, "requantize")
    return out


def forward(acc, multiplier, shift, zero_point, qmin, qmax, rounding, out_dtype):
    out = new_output(tuple(acc.shape), out_dtype, acc.device)
    return requant_into(acc, multiplier, shift, None, zero_point, qmin, qmax, rounding, out)


def linear_forward(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype):
    """x [M, K] int8 row view, weight [N, K] int8 contiguous, bias int32 [N] or None."""
    M, N = x.shape[0], weight.shape[0]
    out = new_output((M, N), out_dtype, x.device)
    if M == 0 or N == 0:
        return out
    wsum = per_tensor(weight, "rowsum", lambda: weight.sum(1, dtype=torch.int64))
    off = _offset_for(weight, "rowsum", wsum, bias, x_zero_point)
    packed = per_tensor(weight, "packed", lambda: _packed(weight)) if M > 16 else None   # the GEMV packs nothing
    int_mm_requant(x, weight, multiplier, shift, off, out_zero_point, qmin, qmax, ROUNDING[rounding], out, packed)
    if not (weight.is_inference() or (bias is not None and bias.is_inference())):
        # the C++ twin replays this launch on the next call of the signature (csrc/fastpath_linear_int8.h;
        # ~55 us of Python glue a call otherwise); it holds weak references to off and packed
        learn = _fastpath.learner("linear_int8_requant")
        if learn is not None:
            acc = torch.int32 if x.dtype == torch.int8 else torch.int64
            learn((x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype),
                  *SHIFT_RANGE[acc], off, packed)
    return out


def _packed(weight):
    """weight's packed panels (_gemm_weight) or None"""
    nb = pack_bytes(*weight.shape)
    return pack_weight(weight, torch.empty(nb, dtype=torch.int8)) if nb else None


def quantize_channels_last(x, scale, zero_point, qmin, qmax, dtype):
    """A quantized model's float input x [N, C, H, W] (fp32, any strides, C <= 64) as codes in
    channels-last memory: clamp(rint(x / scale) + zero_point, qmin, qmax), NaN -> 0, in fp32 (the
    torch ops of quant/static.py QParams.quantize, bit for bit), in one pass (tsr_quantize_cl)."""
    N, C, H, W = x.shape
    out = new_output((N, H, W, C), dtype, x.device)
    f = cpu.declare(_lib(), "tsr_quantize_cl", "p" + "l" * 8 + "ffffipi")
    rc = f(cpu.ptr(x), N, C, H, W, *x.stride(), scale, float(zero_point), float(qmin), float(qmax),
           int(dtype == torch.int16), cpu.ptr(out), cpu.threads_for(x.numel()))
    cpu.check_rc(rc, "quantize to channels-last codes")
    return out.permute(0, 3, 1, 2)


def im2col(x, kh, kw, stride, padding, dilation, Ho, Wo, pad_value, groups=1, order=0):
    """order 0: columns (c, ky, kx); order 1 (channels-last x): (group, ky, kx, c) -- see requant.c."""
    Nb, C, H, W = x.shape
    cols = new_output((Nb * Ho * Wo, C * kh * kw), x.dtype, x.device)
    if cols.numel() == 0:
        return cols
    f = cpu.declare(_lib(), "tsr_im2col", "pi" + "l" * 20 + "ipi")
    rc = f(cpu.ptr(x), x.element_size(), Nb, C, H, W, *x.stride(), kh, kw, *stride, *padding, *dilation, Ho, Wo,
           pad_value, groups, order, cpu.ptr(cols), cpu.threads_for(cols.numel()))
    cpu.check_rc(rc, "conv2d_int8 im2col")
    return cols


def transpose_i8(src, B, R, S, ss, bs, dst, ds, bd):
    """dst[b][s][r] = src[b][r][s], int8 (tsr_transpose_i8, element strides)."""
    if B and R and S:
        f = cpu.declare(_lib(), "tsr_transpose_i8", "plllllplli")
        rc = f(cpu.ptr(src), B, R, S, ss, bs, cpu.ptr(dst), ds, bd, cpu.threads_for(B * R * S))
        cpu.check_rc(rc, "conv2d_int8 layout copy")
    return dst


def _channels_last(x):
    """x [N, C, H, W] as a view of channels-last memory (unit channel stride): x itself when it
    already is (or C == 1), else one transposing copy (tsr_transpose_i8 for contiguous int8)."""
    if x.stride(1) == 1 or x.shape[1] <= 1:
        return x
    Nb, C, H, W = x.shape
    xc = new_output((Nb, H, W, C), x.dtype, x.device)
    if x.dtype == torch.int8 and x.is_contiguous():
        transpose_i8(x, Nb, C, H * W, H * W, C * H * W, xc, C, C * H * W)
    else:
        xc.copy_(x.permute(0, 2, 3, 1))
    return xc.permute(0, 3, 1, 2)


def rows_to_nchw(rows, Nb, Ho, Wo):
    """The conv's output rows [Nb*Ho*Wo, O] as a contiguous NCHW tensor (int8: tsr_transpose_i8)."""
    O = rows.shape[1]
    y = new_output((Nb, O, Ho, Wo), rows.dtype, rows.device)
    if rows.dtype == torch.int8 and rows.is_contiguous():
        return transpose_i8(rows, Nb, Ho * Wo, O, O, Ho * Wo * O, y, Ho * Wo, O * Ho * Wo)
    return y.copy_(rows.view(Nb, Ho, Wo, O).permute(0, 3, 1, 2))


def _gemm_weight(weight, order):
    """(w2 [O, K] in the im2col column order, its int64 row sums, buf, packed), derived once per
    weight tensor (per_tensor) -- the permute of a 512x512x3x3 weight cost 1.2 ms, more than its
    GEMM.  buf (int8, 1-D) holds w2 and, 64-byte aligned after it, the VNNI GEMM's packed panels
    (``packed``, a view; None where this CPU has no VNNI kernel): packing them on every call was
    ~3 us of a 45 us MobileNetV2 pointwise layer.  buf is what the C++ twin holds (_learn)."""
    O = weight.shape[0]
    src = (weight.permute(0, 2, 3, 1) if order else weight).reshape(O, -1)
    K = src.shape[1]
    head, nb = (O * K + 63) // 64 * 64, pack_bytes(O, K)
    buf = torch.empty(head + nb, dtype=torch.int8)
    w2 = buf[:O * K].view(O, K).copy_(src)
    return w2, w2.sum(1, dtype=torch.int64), buf, pack_weight(w2, buf[head:]) if nb else None


def _offset(wsum, bias, x_zero_point):
    """int64 [O]: bias - x_zp * sum_k w[o, k] (module docstring), from the cached row sums."""
    off = wsum * -x_zero_point
    return off if bias is None else off.add_(bias)


def _offset_for(weight, kind, wsum, bias, x_zero_point, derive=None):
    """``_offset`` (and ``derive(off)``, when given) memoised on the weight (per_tensor) for one bias
    and x_zp: the two tensor ops, and the depthwise kernel's exactness test, were ~10-20 us of
    every call of a quantized model's layers.  The entry holds a reference to the bias it was made
    for and checks identity, version and address, so a bias changed in place, or a new bias
    tensor, rebuilds it; one entry per x_zp (a few at most), never read back after a change."""
    if bias is not None and bias.is_inference():   # no version counter to stamp: derived on each call
        off = _offset(wsum, bias, x_zero_point)
        return (off, derive(off)) if derive is not None else off
    memo = per_tensor(weight, (kind, "offset"), dict)
    stamp = None if bias is None else (bias._version, bias.data_ptr())
    hit = memo.get(x_zero_point)
    if hit is not None and hit[0] is bias and hit[1] == stamp:
        return hit[2]
    off = _offset(wsum, bias, x_zero_point)
    value = (off, derive(off)) if derive is not None else off
    if len(memo) >= 8:
        memo.clear()
    memo[x_zero_point] = (bias, stamp, value)
    return value


def conv_forward(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out_dtype,
                 stride, padding, dilation, groups, Ho, Wo):
    """x [N, C, H, W] int8/int16 (any strides); weight [O, C/g, kh, kw] int8 contiguous.
    Returns channels-last rows [N*Ho*Wo, O]."""
    args = (x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, stride, padding, dilation, groups, qmin,
            qmax, rounding, out_dtype)
    Nb = x.shape[0]
    O, Cg, kh, kw = weight.shape
    out = new_output((Nb * Ho * Wo, O), out_dtype, x.device)
    if out.numel() == 0:
        return out
    sub = kh == kw == 1 and not any(padding) and tuple(stride) != (1, 1)
    if sub:
        # a strided 1x1 conv reads every stride-th pixel: subsample first (a view), so the layout copy
        # below moves only those
        x, stride = x[:, :, ::stride[0], ::stride[1]], (1, 1)
    depthwise = Cg == 1 and groups == O and groups > 1
    # channels-last x (unit channel stride): depthwise, the channel loop is unit-stride (vectorised);
    # otherwise each tap is Cg contiguous channels, gathered with one memcpy, in (ky, kx, c) column
    # order -- the weight is permuted to match (O * K bytes, small)
    order = int(Cg > 1)
    xc = _channels_last(x) if depthwise or order else x
    # NCHW x: one transposing copy to channels-last (N*C*H*W elements, ~1/(kh*kw) of the im2col
    # rows it feeds) buys the memcpy gather; the per-element NCHW gather was ~15x slower
    pre, x = xc is not x, xc
    if depthwise:
        route, held = _depthwise(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax,
                                 rounding, out, stride, padding, dilation, Ho, Wo)
        _learn(args, route, (sub, pre, 0, 0, Ho, Wo), held)
        return out
    xr = x.permute(0, 2, 3, 1)
    gather = not (kh == kw == 1 and order and not any(padding) and tuple(stride) == (1, 1) and xr.is_contiguous())
    w2, wsum, wbuf, packed = per_tensor(weight, ("conv2d_int8", order), lambda: _gemm_weight(weight, order))
    off = _offset_for(weight, ("conv2d_int8", order), wsum, bias, x_zero_point)
    r = ROUNDING[rounding]
    if gather and order and groups == 1 and x.dtype == torch.int8 and (kw * Cg >= FUSED_MIN_RUN or kh * kw * Cg <= FUSED_ROW_MAX) \
            and conv_requant(
            x, kh, kw, stride, padding, dilation, Ho, Wo, x_zero_point, w2, multiplier, shift, off, out_zero_point,
            qmin, qmax, r, out, packed):
        # the GEMM made the im2col rows itself, a chunk at a time (qi8_im2col.h): no matrix in memory
        _learn(args, GEMM, (sub, pre, FUSED, order, Ho, Wo), (wbuf, off))
        return out
    if gather:
        cols = im2col(x, kh, kw, stride, padding, dilation, Ho, Wo, x_zero_point, groups, order)
    else:
        cols = xr.view(Nb * Ho * Wo, -1)   # a pointwise conv of channels-last x: its rows already are the columns
    if groups == 1:   # no per-group views (five of them were ~6 us a call)
        int_mm_requant(cols, w2, multiplier, shift, off, out_zero_point, qmin, qmax, r, out, packed)
    else:
        Og, Kg = O // groups, Cg * kh * kw
        per_ch = multiplier.numel() > 1
        for g in range(groups):
            o0, o1 = g * Og, (g + 1) * Og
            int_mm_requant(cols[:, g * Kg:(g + 1) * Kg], w2[o0:o1], multiplier[o0:o1] if per_ch else multiplier,
                           shift[o0:o1] if per_ch else shift, off[o0:o1], out_zero_point, qmin, qmax, r,
                           out[:, o0:o1])
    _learn(args, GEMM, (sub, pre, gather, order, Ho, Wo), (wbuf, off))
    return out


# what conv_forward did, for the C++ twin of conv2d_int8's body (csrc/fastpath_conv2d_int8.h)
GEMM, DEPTHWISE_K3, DEPTHWISE = 1, 2, 3
FUSED = 2   # the im2col flag's value where the GEMM made the rows itself (conv_requant)
# conv_requant where a tap row's run (kw C bytes) is at least FUSED_MIN_RUN long, or the whole row
# (kh kw C bytes) at most FUSED_ROW_MAX, built in one register (qi8_im2col.h ic_row64).  Copied a
# run at a time, MobileNetV2's 27-byte stem rows (9-byte runs) measured 0.6-0.7x tsr_im2col;
# ResNet-18's 147-byte stem rows (21-byte runs) 1.03-1.12x, its 3x3 layers ~2x in a whole model
FUSED_MIN_RUN = 16
FUSED_ROW_MAX = 64


def _learn(args, route, flags, held):
    """Tell the C++ twin what this call did, so the next call of its signature replays it there
    (~60 us of Python glue a call otherwise: most of a batch-1 MobileNetV2 layer).  route: GEMM,
    DEPTHWISE_K3 or DEPTHWISE; flags: (x subsampled (strided 1x1), x made channels-last when it
    was not, im2col (0: x's rows are the GEMM's columns, 1: tsr_im2col's matrix, FUSED: rows made
    by the GEMM), im2col's column order, Ho, Wo);
    held: the two tensors derived from the weight (and bias, x_zp) that the kernel reads -- (wbuf,
    off) (_gemm_weight: w2 and its packed panels), (wf, init) or (wt, off): the twin keeps weak
    references, so a rebuilt derivation is a miss.  Also the stamps of the weight and the bias (per_tensor's), the shift range the Python
    check applies (the twin checks the shift values of every call against it).  Not while a test
    places or poisons buffers (_fastpath.learner), nor for inference-mode weights (no version
    counter to stamp)."""
    weight, bias = args[2], args[3]
    if weight.is_inference() or (bias is not None and bias.is_inference()):
        return
    learn = _fastpath.learner("conv2d_int8")
    if learn is not None:
        acc = torch.int32 if args[0].dtype == torch.int8 else torch.int64
        learn(args, route, tuple(int(f) for f in flags) + SHIFT_RANGE[acc], *held)


def _depthwise(x, x_zero_point, weight, bias, multiplier, shift, out_zero_point, qmin, qmax, rounding, out,
               stride, padding, dilation, Ho, Wo):
    """Depthwise conv (one input channel and one output a group): tsr_dw_requant's direct tap loop,
    not a GEMM per group (thousands of tiny calls in MobileNetV2), requantized row by row.
    Returns (route, the two derived tensors it read) for _learn."""
    Nb, C, H, W = x.shape   # x channels-last (conv_forward)
    kh, kw = weight.shape[2:]
    if x.dtype == torch.int8 and kw == 3 and dilation[1] == 1 and stride[1] in (1, 2) and _k3_available():
        wf, wsum = per_tensor(weight, "conv2d_int8_dw_k3", lambda: _dw_weight_f32(weight))
        # requant.c: exact fp32 sums while |off| + the taps' |sum| stay below 2^24; init: off in fp32
        off, (exact, init) = _offset_for(weight, "conv2d_int8_dw_k3", wsum, bias, x_zero_point, lambda o: (
            bool(o.abs().max() <= _F32_EXACT - kh * kw * (1 << 14)), o.float()))
        if exact:
            f = cpu.declare(_lib(), "tsr_dw_requant_k3", "p" + "l" * 7 + "pp" + "l" * 9 + "ppl" + "llli" + "plii")
            rc = f(cpu.ptr(x), Nb, C, H, W, x.stride(0), x.stride(2), x.stride(3), cpu.ptr(wf), cpu.ptr(init),
                   kh, stride[0], stride[1], *padding, dilation[0], Ho, Wo, x_zero_point, cpu.ptr(multiplier),
                   cpu.ptr(shift), int(multiplier.numel() > 1), out_zero_point, qmin, qmax, ROUNDING[rounding],
                   cpu.ptr(out), out.stride(0), int(out.dtype == torch.int16), cpu.threads_for(out.numel() * kh * 3))
            cpu.check_rc(rc, "conv2d_int8 depthwise")
            return DEPTHWISE_K3, (wf, init)
    wt, wsum = per_tensor(weight, "conv2d_int8_dw", lambda: _dw_weight(weight))
    f = cpu.declare(_lib(), "tsr_dw_requant", "pi" + "l" * 8 + "p" + "l" * 11 + "pplp" + "lll" + "iplii")
    per_ch = int(multiplier.numel() > 1)
    off = _offset_for(weight, "conv2d_int8_dw", wsum, bias, x_zero_point)
    rc = f(cpu.ptr(x), x.element_size(), Nb, C, H, W, *x.stride(), cpu.ptr(wt), kh, kw, *stride, *padding,
           *dilation, Ho, Wo, x_zero_point, cpu.ptr(multiplier), cpu.ptr(shift), per_ch, cpu.ptr(off), out_zero_point,
           qmin, qmax, ROUNDING[rounding], cpu.ptr(out),
           out.stride(0), int(out.dtype == torch.int16), cpu.threads_for(out.numel() * kh * kw))
    cpu.check_rc(rc, "conv2d_int8 depthwise")
    return DEPTHWISE, (wt, off)


_F32_EXACT = 1 << 24


def _k3_available():
    return bool(cpu.declare(_lib(), "tsr_dw_requant_k3_available", "")())


def _dw_weight_f32(weight):
    """(fp32 [kh][3][C], int64 sums [C]) of a 3-wide depthwise weight, once per tensor"""
    return (contiguous(weight[:, 0].permute(1, 2, 0).float()),
            weight.reshape(weight.shape[0], -1).sum(1, dtype=torch.int64))


def _dw_weight(weight):
    """(taps-major int32 [kh*kw, C], int64 row sums [C]) of a depthwise weight, once per tensor"""
    w2 = weight.reshape(weight.shape[0], -1)
    return contiguous(w2.t().to(torch.int32)), w2.sum(1, dtype=torch.int64)
