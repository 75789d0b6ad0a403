"""Native CPU launchers of the int8 matmuls (kernel: qlinear_int8.c, one entry point).

``TESSERA_QI8_VNNI=0`` forces the portable C micro-kernels at the avx512 level (tests use it
to prove they are bit-exact with the VNNI ones); the generic/avx2 levels always run them.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ... import _env, dispatch
from ..._library import new_output
from ...backends import cpu
from .ref import ACT_CODE, DTYPES, INT_DTYPES  # noqa: F401

_SRC = Path(__file__).with_name("qlinear_int8.c")
_INT_KIND = {torch.int8: 8, torch.int16: 16}


def _lib():
    return cpu.library("qlinear_int8", _SRC)


def has_vnni() -> bool:
    """Does the loaded build (this ISA level, this CPU) run the AVX512-VNNI micro-kernels?"""
    return bool(cpu.declare(_lib(), "tsr_qi8_has_vnni", "")())


def has_amx() -> bool:
    """Does this CPU run the int8 broadcast GEMM on AMX tiles (AMX-INT8, tile state granted)?"""
    return has_vnni() and bool(cpu.declare(_lib(), "tsr_qi8_has_amx", "")())


def _vnni_ok() -> int:
    """``TESSERA_QI8_VNNI`` as the kernels' ``vnni_ok``: 0 portable C, 2 VNNI even where AMX
    exists, 1 (default) the best the CPU has."""
    v = _env.get("TESSERA_QI8_VNNI", "1")
    return 0 if v == "0" else 2 if v == "2" else 1


def _run(x, xkind, bits, weight, sw, bias, act, y, ydtype):
    M, K = x.shape
    N = weight.shape[0]
    if M == 0 or N == 0:
        return y
    f = cpu.declare(_lib(), "tsr_qi8_mm", "pliillplppipiii")
    rc = f(cpu.ptr(x), x.stride(0), xkind, bits, M, K, cpu.ptr(weight), N, cpu.ptr(sw), cpu.ptr(bias),
           ACT_CODE[act], cpu.ptr(y), ydtype, _vnni_ok(), cpu.threads_for(max(M, 16) * N * K // 16))
    cpu.check_rc(rc, "int8 matmul")
    return y


def int_mm_forward(a, b):
    """a [M, K] int8/int16 row view (unit inner stride), b [N, K] int8 contiguous."""
    out_dtype = torch.int32 if a.dtype == torch.int8 else torch.int64
    y = new_output((a.shape[0], b.shape[0]), out_dtype, a.device)
    return _run(a, _INT_KIND[a.dtype], _INT_KIND[a.dtype], b, None, None, None, y, -1)


def int_mm_requant(a, b, mult, shift, off, zp, qmin, qmax, rounding, out, packed=None):
    """out [M, N] (int8 / int16 row view) = requantize(a @ b.T + off) with tessera_requant.h's
    arithmetic (rounding 0 double, 1 single), a [M, K] int8 / int16 row view, b [N, K] int8
    contiguous, mult / shift int32 [N] or [1], off int64 [N] or None, packed: b's panels
    (``pack_weight``) or None (tsr_qi8_mm_rq)."""
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return out
    f = cpu.declare(_lib(), "tsr_qi8_mm_rq", "plillplpplplllipliiip")
    rc = f(cpu.ptr(a), a.stride(0), _INT_KIND[a.dtype], M, K, cpu.ptr(b), N, cpu.ptr(mult), cpu.ptr(shift),
           int(mult.numel() > 1), cpu.ptr(off), zp, qmin, qmax, rounding, cpu.ptr(out), out.stride(0),
           int(out.dtype == torch.int16), _vnni_ok(), cpu.threads_for(max(M, 16) * N * K // 16),
           None if packed is None else cpu.ptr(packed))
    cpu.check_rc(rc, "int8 matmul + requantize")
    return out


def conv_requant(x, kh, kw, stride, padding, dilation, Ho, Wo, x_zp, w2, mult, shift, off, zp, qmin, qmax, rounding,
                 out, packed=None) -> bool:
    """``int_mm_requant`` of a conv's im2col rows, each thread making the rows of its chunk as it
    needs them (tsr_qi8_conv_rq, qi8_im2col.h) instead of reading a gathered matrix: x int8
    [N, C, H, W] with unit channel stride (channels-last), one group, w2 [O, kh kw C] in (ky, kx,
    c) column order, out [N Ho Wo, O] int8 rows.  False, with nothing written, where the call
    would not take the broadcast GEMM (no VNNI, M <= 16): gather the matrix then."""
    Nb, C, H, W = x.shape
    N, K = w2.shape
    f = cpu.declare(_lib(), "tsr_qi8_conv_rq", "p" + "l" * 18 + "plpplplllipliip")
    M = Nb * Ho * Wo
    rc = f(cpu.ptr(x), Nb, C, H, W, x.stride(0), x.stride(2), x.stride(3), kh, kw, *stride, *padding, *dilation, Ho,
           Wo, x_zp, cpu.ptr(w2), N, cpu.ptr(mult), cpu.ptr(shift), int(mult.numel() > 1), cpu.ptr(off), zp, qmin,
           qmax, rounding, cpu.ptr(out), out.stride(0), _vnni_ok(), cpu.threads_for(max(M, 16) * N * K // 16),
           None if packed is None else cpu.ptr(packed))
    if rc == cpu.EINVAL:
        return False
    cpu.check_rc(rc, "int8 conv + requantize")
    return True


def pack_bytes(N, K) -> int:
    """Bytes of ``pack_weight``'s buffer for an [N, K] weight: 0 where this build or CPU has no
    VNNI broadcast kernel (nothing to cache)."""
    return int(cpu.declare(_lib(), "tsr_qi8_pack_bytes", "ll")(N, K))


def pack_weight(w, dst):
    """The broadcast GEMM's panels and column sums of w [N, K] (int8, contiguous) into dst (int8,
    ``pack_bytes(N, K)`` elements, 64-byte aligned): what ``int_mm_requant(..., packed=dst)`` reads
    instead of packing w on every call.  The caller rebuilds it when w changes."""
    rc = cpu.declare(_lib(), "tsr_qi8_pack", "plpp")(cpu.ptr(w), w.shape[0], w.shape[1], cpu.ptr(dst))
    cpu.check_rc(rc, "int8 weight packing")
    return dst


def linear_forward(x, weight, sw, bias, activation, bits):
    M, K = x.shape
    N = weight.shape[0]
    if M and N and dispatch.use_vendor("linear_w8a8" if bits == 8 else "linear_a16w8", x.dtype, M, N, K):
        return dispatch.int8_linear(x, weight, sw, bias, activation, bits)
    y = new_output((x.shape[0], weight.shape[0]), x.dtype, x.device)
    return _run(x, cpu.DTYPE_CODE[x.dtype], bits, weight, sw, bias, activation, y, cpu.DTYPE_CODE[x.dtype])
