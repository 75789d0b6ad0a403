"""Packing of 4-bit codes and explicit converters to / from other libraries' layouts.

tessera's 4-bit layout (``pack_int4``): codes [..., K] (uint8 0..15) -> bytes [..., K/2],
byte j = code[2j] | code[2j+1] << 4 (low nibble = even k).  Weights are [N, K] (nn.Linear).

GPTQ (AutoGPTQ / GPTQModel / exllama "gptq" checkpoints), weight stored as [K, N]:
  qweight int32 [K/8, N]   k = 8r + i of column n at bits 4i of qweight[r, n]
  qzeros  int32 [K/g, N/8] zero of (group, n = 8c + i) at bits 4i of qzeros[group, c]
  scales  fp16  [K/g, N]   value = (q - zero) * scale
  Historical "v1" format (AutoGPTQ's default ``checkpoint_format="gptq"``, most checkpoints on
  the Hub): qzeros holds zero - 1 and loaders add 1 back; a zero point of 0 cannot be stored
  (it wraps to 15 and loads as 16).  ``v1=True`` (default) reads / writes that convention and
  raises a ValueError for a zero of 0; ``v1=False`` is GPTQModel's "gptq_v2" (zeros as-is).
  Only sequential groups (g_idx[k] = k // g, no act-order permutation) are supported.

AWQ (llm-awq / AutoAWQ "GEMM" checkpoints), weight stored as [K, N]:
  qweight int32 [K, N/8]   n = 8c + ORDER[i] of row k at bits 4i of qweight[k, c],
                           ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
  qzeros  int32 [K/g, N/8] the same nibble order, zeros as-is
  scales  fp16  [K/g, N]

ggml Q4_0 / Q8_0 (llama.cpp), blocks of 32 values along K, row after row:
  block_q4_0 = { fp16 d; uint8 qs[16] }  (18 bytes)  qs[j] = q[j] | q[j + 16] << 4, value (q - 8) * d
  block_q8_0 = { fp16 d; int8 qs[32] }   (34 bytes)  value q * d
  (fp16 little-endian); ``to_ggml`` returns the bytes as a uint8 tensor [N, K/32 * block bytes].

Scales: GPTQ/AWQ/ggml store fp16.  Converting tessera's fp32 scales to them rounds to nearest
even (the dequantised values change by up to 2^-11 relative; codes and zeros are unchanged);
converting from them to tessera is exact (fp16 -> fp32).  tessera's own q4_0/q8_0 formats keep
the fp16 scale, so they convert to and from ggml bytes without any rounding.
"""
from __future__ import annotations

import torch

from .contract import pack_int4, unpack_int4
from .formats import FORMATS, QTensor, format_info

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)


def _pack8(v: torch.Tensor) -> torch.Tensor:
    """[..., 8] nibbles (int64 0..15) -> int32 with nibble i at bits 4i (two's complement wrap)."""
    u = (v.long() << _SHIFTS.to(v.device)).sum(-1)
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32)


def _unpack8(w: torch.Tensor) -> torch.Tensor:
    """int32 [...] -> [..., 8] nibbles (int64), nibble i from bits 4i."""
    return (w.long()[..., None] >> _SHIFTS.to(w.device)) & 15


def _int4_parts(qt: QTensor):
    info = qt.info
    if info.qtype not in ("int4", "int4_zp") or qt.data.dim() != 2:
        raise ValueError(f"argument 'qt' must be a 2-D int4-g* QTensor, got format {qt.fmt!r} shape {qt.shape}")
    codes = unpack_int4(qt.data)
    zero = qt.zero if qt.zero is not None else torch.full_like(qt.scale, 8, dtype=torch.uint8)
    return codes, qt.scale, zero, info.block


def _from_parts(codes_nk: torch.Tensor, scale_ng: torch.Tensor, zero_ng: torch.Tensor, g: int) -> QTensor:
    if g not in (32, 64, 128):
        raise ValueError(f"group size {g} is not a tessera int4 format (32, 64 or 128)")
    if zero_ng.numel() and int(zero_ng.max()) > 15:
        raise ValueError("a zero point above 15 cannot be stored in tessera's uint8 0..15 zero points")
    sym = bool((zero_ng == 8).all())
    fmt = f"int4-g{g}" if sym else f"int4-g{g}-zp"
    z = None if sym else zero_ng.to(torch.uint8).contiguous()
    return QTensor(fmt, pack_int4(codes_nk.to(torch.uint8).contiguous()), scale_ng.float().contiguous(), z,
                   (codes_nk.shape[0], codes_nk.shape[1]))


def to_gptq(qt: QTensor, v1: bool = True) -> dict:
    """tessera int4-g* weight [N, K] -> {"qweight", "qzeros", "scales", "group_size"} (GPTQ)."""
    codes, scale, zero, g = _int4_parts(qt)
    N, K = codes.shape
    if N % 8:
        raise ValueError(f"to_gptq: N={N} must be a multiple of 8 (qzeros packs 8 columns per int32)")
    z = zero.long().t()                                             # [K/g, N]
    if v1:
        if bool((z == 0).any()):
            raise ValueError("to_gptq: a zero point of 0 cannot be stored in the v1 (zero - 1) format; use v1=False")
        z = z - 1
    qweight = _pack8(codes.long().t().reshape(K // 8, 8, N).transpose(1, 2))   # [K/8, N]
    qzeros = _pack8(z.reshape(K // g, N // 8, 8))
    return {"qweight": qweight, "qzeros": qzeros, "scales": scale.t().to(torch.float16).contiguous(),
            "group_size": g}


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
              v1: bool = True) -> QTensor:
    """GPTQ tensors -> tessera QTensor [N, K] (int4-g{g}, or -zp unless every zero is 8); exact."""
    K8, N = qweight.shape
    codes = _unpack8(qweight).transpose(1, 2).reshape(K8 * 8, N).t()       # [N, K]
    z = _unpack8(qzeros).reshape(qzeros.shape[0], -1)                      # [K/g, N]
    if v1:
        z = z + 1
    return _from_parts(codes, scales.float().t(), z.t(), group_size)


def to_awq(qt: QTensor) -> dict:
    """tessera int4-g* weight [N, K] -> {"qweight", "qzeros", "scales", "group_size"} (AWQ GEMM)."""
    codes, scale, zero, g = _int4_parts(qt)
    N, K = codes.shape
    if N % 8:
        raise ValueError(f"to_awq: N={N} must be a multiple of 8 (8 columns per int32)")
    order = torch.tensor(AWQ_ORDER)
    qweight = _pack8(codes.long().t().reshape(K, N // 8, 8)[..., order])
    qzeros = _pack8(zero.long().t().reshape(K // g, N // 8, 8)[..., order])
    return {"qweight": qweight, "qzeros": qzeros, "scales": scale.t().to(torch.float16).contiguous(),
            "group_size": g}


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> QTensor:
    """AWQ GEMM tensors -> tessera QTensor [N, K]; exact."""
    inv = torch.argsort(torch.tensor(AWQ_ORDER))                            # nibble of column j
    K = qweight.shape[0]
    codes = _unpack8(qweight)[..., inv].reshape(K, -1).t()                  # [N, K]
    z = _unpack8(qzeros)[..., inv].reshape(qzeros.shape[0], -1)             # [K/g, N]
    return _from_parts(codes, scales.float().t(), z.t(), group_size)


def _fp16_bytes(d: torch.Tensor) -> torch.Tensor:
    """fp16 [..., n] -> uint8 [..., n, 2] little-endian."""
    b = d.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.stack((b & 0xFF, b >> 8), dim=-1).to(torch.uint8)


def to_ggml(qt: QTensor) -> torch.Tensor:
    """q4_0 / q8_0 QTensor [..., K] -> ggml block bytes, uint8 [..., K/32 * (18 | 34)]."""
    if qt.fmt not in ("q4_0", "q8_0"):
        raise ValueError(f"to_ggml: argument 'qt' must be a q4_0 or q8_0 QTensor, got {qt.fmt!r}")
    lead, K = tuple(qt.shape[:-1]), qt.shape[-1]
    d = _fp16_bytes(qt.scale.to(torch.float16))                            # [..., K/32, 2]
    if qt.fmt == "q4_0":
        c = unpack_int4(qt.data).reshape(*lead, K // 32, 32)
        qs = c[..., :16] | (c[..., 16:] << 4)
    else:
        qs = qt.data.reshape(*lead, K // 32, 32).view(torch.uint8)
    return torch.cat((d, qs), dim=-1).reshape(*lead, -1)


def from_ggml(raw: torch.Tensor, fmt: str, shape) -> QTensor:
    """ggml block bytes (uint8, any shape holding prod(shape)/32 blocks) -> q4_0 / q8_0 QTensor."""
    info = format_info(fmt)
    if info.name not in ("q4_0", "q8_0"):
        raise ValueError(f"from_ggml: argument 'fmt'={fmt!r} must be 'q4_0' or 'q8_0'")
    shape = tuple(int(s) for s in shape)
    lead, K = shape[:-1], shape[-1]
    if K % 32 or raw.dtype != torch.uint8:
        raise ValueError(f"from_ggml: need uint8 bytes and a last dim divisible by 32, got {raw.dtype}, {shape}")
    bb = 18 if info.name == "q4_0" else 34
    blocks = raw.reshape(*lead, K // 32, bb)
    d = blocks[..., 0].to(torch.int32) | (blocks[..., 1].to(torch.int32) << 8)
    d = torch.where(d >= 32768, d - 65536, d).to(torch.int16)
    scale = d.view(torch.float16).contiguous()
    qs = blocks[..., 2:]
    if info.name == "q4_0":
        codes = torch.cat((qs & 15, qs >> 4), dim=-1).reshape(*lead, K)
        data = pack_int4(codes.contiguous())
    else:
        data = qs.contiguous().view(torch.int8).reshape(*lead, K)
    return QTensor(info.name, data, scale, None, shape)


__all__ = ["AWQ_ORDER", "pack_int4", "unpack_int4", "to_gptq", "from_gptq", "to_awq", "from_awq", "to_ggml",
           "from_ggml", "FORMATS"]
