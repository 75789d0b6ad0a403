"""Triton shims for tests/test_quant_contract.py: the ``backends/triton_lang.py`` quantisation
helpers applied element-wise (module level, as Triton resolves a kernel's globals here)."""
import torch
import triton
import triton.language as tl

from tessera.backends.triton_lang import fp8_bits_to_f32, fp8_e4m3_bits, fp8_e5m2_bits, rint


@triton.jit
def _encode(x_ptr, o_ptr, n, QMAX: tl.constexpr, KIND: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    q = tl.load(x_ptr + offs, mask=m, other=0.0)
    q = tl.where(q != q, 0.0, q)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    if KIND == 0:
        code = rint(q, False).to(tl.int32)
    elif KIND == 2:
        code = fp8_e4m3_bits(q)
    else:
        code = fp8_e5m2_bits(q)
    tl.store(o_ptr + offs, code, mask=m)


@triton.jit
def _decode(b_ptr, o_ptr, n, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, fp8_bits_to_f32(tl.load(b_ptr + offs, mask=m, other=0), E5M2), mask=m)


def encode(x: torch.Tensor, qmax: float, kind: int) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.int32, device=x.device)
    _encode[(1,)](x, out, x.numel(), QMAX=qmax, KIND=kind, BLOCK=triton.next_power_of_2(x.numel()))
    return out


def decode(codes: torch.Tensor, e5m2: bool) -> torch.Tensor:
    out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    _decode[(1,)](codes, out, codes.numel(), E5M2=e5m2, BLOCK=triton.next_power_of_2(codes.numel()))
    return out
