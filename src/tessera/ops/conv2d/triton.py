"""conv2d Triton forward (GPU; CPU tensors under TRITON_INTERPRET=1): implicit GEMM.

One program computes a BLOCK_M (output pixels, flattened n*OH*OW) x BLOCK_N (output channels
of one group) tile: for each tap (kh, kw) and each BLOCK_K slice of the group's input
channels it gathers the [BLOCK_M, BLOCK_K] input tile straight from x's strides (padding is
the load mask, so no padded copy exists), loads the [BLOCK_K, BLOCK_N] weight tile from
weight's strides, and accumulates ``tl.dot`` in fp32.  Operands are widened to fp32 with
``input_precision="ieee"`` (the interpreter's bf16 dot is wrong, and TF32 would miss the fp32
tolerance); a GPU-tuned build would feed fp16/bf16 straight to the tensor cores.  The
epilogue adds the bias, applies the activation on the fp32 sum and stores in y's dtype
through y's strides (channels-last or NCHW).  Offsets are int64.

No backward kernels yet: ``BACKWARD = False`` (a gradient request raises BackendError).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._library import new_output
from ..._registry import forward_only
from ...backends.triton import interpreted, next_pow2, param

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKWARD = False
backward = forward_only("conv2d", "triton")
ACT_CODE = {None: 0, "relu": 1, "relu6": 2, "silu": 3, "gelu": 4}


@triton.jit
def _conv2d_fwd_kernel(x_ptr, sxn, sxc, sxh, sxw, w_ptr, swo, swc, swh, sww, b_ptr, y_ptr, syn, syc, syh, syw,
                       H, W, OH, OW, CING, COUTG, M, KH, KW, SH, SW, PT, PL, DH, DW,
                       HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.program_id(2)
    pix = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    pmask = pix < M
    ow = pix % OW
    t = pix // OW
    oh = t % OH
    n = t // OH
    co = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = co < COUTG
    cglob = (g * COUTG + co).to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kh in range(0, KH):
        ih = oh * SH - PT + kh * DH
        for kw in range(0, KW):
            iw = ow * SW - PL + kw * DW
            inside = pmask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            xrow = x_ptr + n * sxn + ih * sxh + iw * sxw
            for k0 in range(0, CING, BLOCK_K):
                ci = k0 + tl.arange(0, BLOCK_K)
                kmask = ci < CING
                cin = (g * CING + ci).to(tl.int64)
                a = tl.load(xrow[:, None] + cin[None, :] * sxc, mask=inside[:, None] & kmask[None, :], other=0.0)
                b = tl.load(w_ptr + cglob[None, :] * swo + ci[:, None].to(tl.int64) * swc + kh * swh + kw * sww,
                            mask=kmask[:, None] & cmask[None, :], other=0.0)
                acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cglob, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACT == 2:
        acc = tl.minimum(tl.maximum(acc, 0.0), 6.0)
    elif ACT == 3:
        acc = acc / (1.0 + tl.exp(-acc))
    elif ACT == 4:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    yoff = n * syn + oh * syh + ow * syw
    tl.store(y_ptr + yoff[:, None] + cglob[None, :] * syc, acc.to(y_ptr.dtype.element_ty),
             mask=pmask[:, None] & cmask[None, :])


def _channels_last(x):
    return x.dim() == 4 and x.shape[1] > 1 and x.stride(1) == 1 and x.stride(3) > 1


def forward(x, weight, bias, stride, pads, dilation, groups, activation):
    N, C, H, W = x.shape
    cout, cing, KH, KW = weight.shape
    OH = (H + pads[0] + pads[1] - dilation[0] * (KH - 1) - 1) // stride[0] + 1
    OW = (W + pads[2] + pads[3] - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    if _channels_last(x):
        y = new_output((N, OH, OW, cout), x.dtype, x.device).permute(0, 3, 1, 2)
    else:
        y = new_output((N, cout, OH, OW), x.dtype, x.device)
    M = N * OH * OW
    if M == 0:
        return y
    coutg = cout // groups
    # tl.dot needs every block dim >= 16; the interpreter pays per program, so use big tiles there
    bm = 128 if interpreted() else 64
    bn = max(16, min(64, next_pow2(coutg)))
    bk = max(16, min(32, next_pow2(cing)))
    b = param(bias) if bias is not None else y  # a w[::2] / expanded bias is indexed as b_ptr + c
    grid = (triton.cdiv(M, bm), triton.cdiv(coutg, bn), groups)
    _conv2d_fwd_kernel[grid](x, *x.stride(), weight, *weight.stride(), b, y, *y.stride(),
                             H, W, OH, OW, cing, coutg, M, KH, KW, stride[0], stride[1], pads[0], pads[2],
                             dilation[0], dilation[1], HAS_BIAS=bias is not None, ACT=ACT_CODE[activation],
                             BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    return y
