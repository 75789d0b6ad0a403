"""The integer contract: how tessera turns floats into quantised values (torch reference).

Every backend (reference, cpu C, Triton, later OpenCL) reproduces these rules bit for bit,
so the rules are stated in fp32 -- the precision a kernel computes in -- not in float64
(``shared/notes/numerics.md``, "The integer contract"):

    x       = fp32(x)                          upcast of an fp32/fp16/bf16 input (exact)
    amax    = max |x| over the scale's block   NaN entries count as 0; an inf gives amax = inf
    scale   = max(amax, 1e-12f) / QMAX         one correctly rounded fp32 division
    q       = x / scale                        correctly rounded fp32 division (never x * (1/s))
    NaN -> 0                                   (NaN inputs, and inf/inf when a block holds inf)
    integer : q = saturate(rint(q), lo, hi)    rint = round half to even (torch.round, C rintf)
    fp8     : q = fp8_rne(clamp(q, -QMAX, QMAX))   saturate first, then round to nearest even

Symmetric integer formats use lo = -QMAX (int8 -127..127, int16 -32767..32767: the most
negative code is unused so negation is exact) except int4, whose nibble covers -8..7:
int4 symmetric uses QMAX = 7 and stores q + 8 (offset binary, as GPTQ and ggml Q4_0 do).

Asymmetric int4 (with a zero point, GPTQ/AWQ style) over a block with range [lo, hi]:
    lo, hi  = min(min x, 0), max(max x, 0)     the range always holds 0, so 0 is exact
    scale   = max(hi - lo, 1e-12f) / 15
    zero    = saturate(rint(-lo / scale), 0, 15)          (uint8, 0..15)
    q       = saturate(rint(x / scale) + zero, 0, 15)
dequantisation is always ``(q - zero) * scale`` in fp32 (zero = 8 for symmetric int4, 0 for
the signed formats), and ``q * scale`` for fp8.

fp8: OCP e4m3fn (QMAX 448, no inf) and e5m2 (QMAX 57344); torch's ``.to(float8_*)`` rounds to
nearest even, and saturating first means no value overflows to inf/NaN.
"""
from __future__ import annotations

import torch

EPS = 1e-12
QMAX = {torch.int8: 127.0, torch.int16: 32767.0, "int4": 7.0,
        torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype, device=x.device), x)


def absmax(x: torch.Tensor, dim=-1, keepdim: bool = False) -> torch.Tensor:
    """fp32 max |x| over ``dim`` (a dim, a tuple, or None for all), NaN counted as 0."""
    a = nan_to_zero(x.float()).abs()
    if dim is None:
        return a.amax() if a.numel() else a.new_zeros(())
    return a.amax(dim=dim, keepdim=keepdim)


def scale_for(amax: torch.Tensor, qtype) -> torch.Tensor:
    """fp32 scale = max(amax, 1e-12) / QMAX (one fp32 division)."""
    return torch.clamp_min(amax.float(), EPS) / QMAX[qtype]


def quantize_values(x: torch.Tensor, scale: torch.Tensor, qtype) -> torch.Tensor:
    """Quantise ``x`` with a ``scale`` broadcastable to it.  int8/int16 -> that dtype;
    "int4" -> uint8 offset-binary codes 0..15 (q + 8, unpacked); fp8 -> that fp8 dtype."""
    q = nan_to_zero(x.float() / scale.float())
    if qtype in FP8:
        m = QMAX[qtype]
        return q.clamp(-m, m).to(qtype)
    if qtype == "int4":
        return (torch.round(q).clamp(-8, 7) + 8).to(torch.uint8)
    m = QMAX[qtype]
    return torch.round(q).clamp(-m, m).to(qtype)


def quantize_asym_int4(x: torch.Tensor, dim: int = -1):
    """Asymmetric int4 over ``dim`` (one block): (codes uint8 0..15, fp32 scale, uint8 zero),
    scale and zero with ``dim`` kept as size 1."""
    xf = nan_to_zero(x.float())
    lo = torch.clamp_max(xf.amin(dim=dim, keepdim=True), 0.0)
    hi = torch.clamp_min(xf.amax(dim=dim, keepdim=True), 0.0)
    scale = torch.clamp_min(hi - lo, EPS) / 15.0
    zero = torch.round(nan_to_zero(-lo / scale)).clamp(0, 15)
    q = (torch.round(nan_to_zero(xf / scale)) + zero).clamp(0, 15)
    return q.to(torch.uint8), scale, zero.to(torch.uint8)


def quantize_rows(x: torch.Tensor, qtype):
    """Per-row (last dim) symmetric quantisation: per-token activations, per-channel weights
    ([N, K] -> scale [N]).  Returns (q, fp32 scale of shape x.shape[:-1])."""
    scale = scale_for(absmax(x, -1), qtype)
    return quantize_values(x, scale[..., None], qtype), scale


def quantize_tensor(x: torch.Tensor, qtype):
    """Per-tensor symmetric quantisation: (q, fp32 scalar scale)."""
    scale = scale_for(absmax(x, None), qtype)
    return quantize_values(x, scale, qtype), scale


def quantize_groups(x: torch.Tensor, group: int, qtype="int4", zero_point: bool = False):
    """Group-wise quantisation along the last dim (K % group == 0): (q codes like x,
    fp32 scale [..., K/group], zero [..., K/group] uint8 or None)."""
    K = x.shape[-1]
    if K % group:
        raise ValueError(f"last dim {K} is not a multiple of group {group}")
    xg = x.reshape(*x.shape[:-1], K // group, group)
    if zero_point:
        if qtype != "int4":
            raise ValueError("zero points are defined for int4 only")
        q, s, z = quantize_asym_int4(xg, -1)
        return q.reshape(x.shape), s[..., 0], z[..., 0]
    scale = scale_for(absmax(xg, -1), qtype)
    return quantize_values(xg, scale[..., None], qtype).reshape(x.shape), scale, None


def quantize_blocks(x: torch.Tensor, block: int, qtype):
    """2-D block-wise quantisation of [N, K] (DeepSeek-V3 128x128 fp8 weights): (q like x,
    fp32 scale [ceil(N/block), ceil(K/block)]); edge blocks are partial."""
    N, K = x.shape
    nb, kb = -(-N // block), -(-K // block)
    pad = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=x.device)
    pad[:N, :K] = nan_to_zero(x.float()).abs()
    amax = pad.reshape(nb, block, kb, block).amax(dim=(1, 3))
    scale = scale_for(amax, qtype)
    full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:N, :K]
    return quantize_values(x, full, qtype), scale


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [..., K] (K even) -> uint8 [..., K/2]: byte j = code[2j] | code[2j+1] << 4
    (low nibble = even index), contiguous.  The one int4 layout of every tessera kernel."""
    if codes.dtype != torch.uint8 or codes.shape[-1] % 2:
        raise ValueError(f"pack_int4: argument 'codes' (shape={tuple(codes.shape)} dtype={codes.dtype}) must be "
                         "uint8 with an even last dimension")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError("pack_int4: argument 'codes' holds values above 15")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K] (inverse of :func:`pack_int4`)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_int4: argument 'packed' (dtype={packed.dtype}) must be uint8")
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def dequantize_values(q: torch.Tensor, scale: torch.Tensor, zero=None) -> torch.Tensor:
    """fp32 ``(q - zero) * scale`` with scale/zero broadcastable to q (zero None -> 0)."""
    v = q.float() if zero is None else q.float() - zero.float()
    return v * scale.float()
