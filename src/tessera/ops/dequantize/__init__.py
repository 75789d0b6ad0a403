"""Block-wise dequantisation (``tessera.dequantize_blocks``), the inverse of
``tessera.quantize_blocks`` for every named format of :mod:`tessera.quant.formats`.

    out = dequantize_blocks(data, scale, zero=None, block_rows=1, block=0, dtype=None)
        = dtype(fp32((q - zero) * scale))          dtype None: the scale's dtype

``data``: int8 / int16 codes [..., K], uint8 bytes [..., K/2] holding two 4-bit offset-binary
codes each (byte j = c[2j] | c[2j+1] << 4), or float8_e4m3fn / float8_e5m2 / float8_e4m3fnuz
values [..., K].
``scale``: fp32 (or fp16 / bf16, e.g. ggml's fp16 scales: upcast exactly) with the shape
``quantize_blocks`` gives for (block_rows, block) (see there).
``zero``: uint8 of the scale's shape (4-bit codes only); None means 8 for 4-bit codes and 0
otherwise.  The fp32 product, then one round-to-nearest-even to ``dtype``, is computed the same
way by every backend (bit-identical results).  No gradient.

Kernels: reference, cpu (dequantize.c), triton, opencl (dequantize.cl: fp8 decoded from the
bits exactly, also on devices that flush fp32 subnormals).

Roofline: read the codes (+ scales), write K values per row in ``dtype``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _checks
from ..._library import as_fp32_param, contiguous, direct, rows
from ..._registry import Case, OpSpec, register_op, select
from ... import _cases as C
from ..quantize import out_shapes
from ..quantize.ref import quantize2d
from .ref import DATA_DTYPES, dequantize_blocks_eager, dequantize_blocks_ref

OP = "dequantize_blocks"


def _check(data, scale, zero, block_rows, block, dtype):
    _checks.tensor(OP, "data", data, dtypes=DATA_DTYPES)
    _checks.tensor(OP, "scale", scale, min_dim=0)
    for name, v in (("block_rows", block_rows), ("block", block)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"tessera.{OP}: argument '{name}'={v!r} must be an int >= 0")
    if dtype is not None and dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"tessera.{OP}: argument 'dtype'={dtype} is not supported; expected one of "
                        "float32, float16, bfloat16")
    if data.shape[-1] == 0:
        raise ValueError(f"tessera.{OP}: argument 'data' ({_checks.describe(data)}) must have a non-empty last dimension")
    if block_rows > 1 and data.dim() != 2:
        raise ValueError(f"tessera.{OP}: argument 'data' ({_checks.describe(data)}) must be 2-D for "
                         f"block_rows={block_rows} (2-D scale blocks)")
    packed = data.dtype == torch.uint8
    K = data.shape[-1] * (2 if packed else 1)
    shape = tuple(data.shape[:-1]) + (K,)
    want = out_shapes(shape, "int4" if packed else "int8", block_rows, block)[1]
    if tuple(scale.shape) != want:
        raise ValueError(f"tessera.{OP}: argument 'scale' ({_checks.describe(scale)}) must have shape {want} "
                         f"for data {tuple(data.shape)} with block_rows={block_rows}, block={block}")
    if zero is not None:
        _checks.tensor(OP, "zero", zero, dtypes=(torch.uint8,), min_dim=0)
        if not packed:
            raise ValueError(f"tessera.{OP}: argument 'zero' ({_checks.describe(zero)}) is only defined for "
                             f"4-bit codes (uint8 data), got data {data.dtype}")
        if tuple(zero.shape) != want:
            raise ValueError(f"tessera.{OP}: argument 'zero' ({_checks.describe(zero)}) must have the shape "
                             f"{want} of 'scale'")
    _checks.same_device(OP, "data", data, scale=scale, zero=zero)
    return shape


def _dequantize_blocks_impl(data: Tensor, scale: Tensor, zero: Optional[Tensor], block_rows: int, block: int,
                            dtype: Optional[torch.dtype], backend: str) -> Tensor:
    shape = _check(data, scale, zero, block_rows, block, dtype)
    dtype = scale.dtype if dtype is None else dtype
    mod = select(SPEC, data.device, dtype, backend)
    out = mod.forward(rows(data), as_fp32_param(scale), contiguous(zero),
                      block_rows, block, dtype)
    return out.reshape(shape)


_dequantize_blocks = torch.library.custom_op("tessera::dequantize_blocks", mutates_args=())(_dequantize_blocks_impl)


@_dequantize_blocks.register_fake
def _(data, scale, zero, block_rows, block, dtype, backend):
    shape = _check(data, scale, zero, block_rows, block, dtype)
    return data.new_empty(shape, dtype=scale.dtype if dtype is None else dtype)


def dequantize_blocks(data: Tensor, scale: Tensor, zero: Optional[Tensor] = None, block_rows: int = 1,
                      block: int = 0, dtype: Optional[torch.dtype] = None, *,
                      backend: Optional[str] = None) -> Tensor:
    """(q - zero) * scale in fp32, rounded to ``dtype`` (default: the scale's dtype); see the module docstring."""
    _checks.python_types(OP, {"data": data, "scale": scale, "zero": zero})
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"tessera.{OP}: argument 'dtype' must be a torch.dtype or None, got {type(dtype).__name__}")
    return direct(_dequantize_blocks, _dequantize_blocks_impl, data, scale, zero)(
        data, scale, zero, block_rows, block, dtype, _checks.backend_arg(OP, backend))


# ---------------------------------------------------------------- spec: cases, roofline

def _build(name, shape, qtype, block_rows, block, scale=1.0, tags=(), layout="contig", raw=False):
    """Codes made by the contract from random x (raw: random fp8 bytes, NaN/inf codes included).
    The scale is passed in the case's dtype (fp16/bf16 scales are rounded copies of the fp32
    ones) and the output dtype follows it; fp32 scales with fp16/bf16 outputs are covered by
    tests/test_quant_formats.py."""
    def mk(dtype, device, gen):
        x = C.make(shape, torch.float32, "cpu", gen, scale=scale)
        codes, s, z = quantize2d(x.reshape(-1, shape[-1]), qtype, block_rows, block)
        cshape, sshape = out_shapes(shape, qtype, block_rows, block)
        codes = codes.reshape(cshape)
        if raw:
            codes = torch.randint(0, 256, cshape, generator=gen, dtype=torch.uint8).view(codes.dtype)
        if layout == "rowslice":
            wide = torch.zeros(*cshape[:-1], cshape[-1] + 3, dtype=codes.dtype)
            wide[..., 1:cshape[-1] + 1] = codes
            codes = wide[..., 1:cshape[-1] + 1]
        kw = {"data": codes.to(device), "scale": s.reshape(sshape).to(dtype).to(device),
              "zero": None if z is None else z.reshape(sshape).to(device),
              "block_rows": block_rows, "block": block}
        return kw
    return Case(name, mk, frozenset(tags))


def _cases():
    out = []
    for q, br, bc in (("int8", 1, 0), ("int8", 0, 0), ("int16", 1, 0), ("int4", 1, 32), ("int4_zp", 1, 32),
                      ("int4_zp", 1, 128), ("q4_0", 1, 32), ("fp8_e4m3", 1, 0), ("fp8_e4m3", 128, 128),
                      ("fp8_e5m2", 0, 0), ("int8", 1, 32)):
        out.append(_build(f"{q}-r{br}-c{bc}-5x128", (5, 128), q, br, bc))
    out += [
        _build("int8-r1-1x1", (1, 1), "int8", 1, 0),
        # int8 codes on the 2-D block grids too (torch.library.opcheck cannot clone fp8 inputs,
        # so its generic case picker must find a smaller non-fp8 case of each signature)
        _build("int8-blk128-3x40", (3, 40), "int8", 128, 128),
        _build("int8-blk4-5x9", (5, 9), "int8", 4, 4),
        _build("int8-r1-3x5x123", (3, 5, 123), "int8", 1, 0),
        _build("int4-r1-c32-3x4x64", (3, 4, 64), "int4", 1, 32),
        _build("int4zp-r1-c32-7x96", (7, 96), "int4_zp", 1, 32, scale=1e3),
        _build("fp8-e4m3-blk-9x11-b4", (9, 11), "fp8_e4m3", 4, 4),
        _build("fp8-e4m3-blk-200x130", (200, 130), "fp8_e4m3", 128, 128, tags={"large"}),
        _build("int8-r1-c32-odd-7x123", (7, 123), "int8", 1, 32),
        _build("fp8-e4m3-raw-bytes", (4, 64), "fp8_e4m3", 1, 0, raw=True, tags={"extreme"}),
        _build("fp8-e5m2-raw-bytes", (4, 64), "fp8_e5m2", 1, 0, raw=True, tags={"extreme"}),
        _build("fp8-e4m3fnuz-raw-bytes", (4, 64), "fp8_e4m3fnuz", 1, 0, raw=True, tags={"extreme"}),
        _build("fp8-e4m3fnuz-r1-5x128", (5, 128), "fp8_e4m3fnuz", 1, 0),
        _build("int4-r1-c128-large", (64, 4096), "int4", 1, 128, tags={"large"}),
        _build("int8-r1-empty", (0, 64), "int8", 1, 0, tags={"empty"}),
        _build("int8-r1-rowslice", (5, 3, 124), "int8", 1, 0, tags={"layout"}, layout="rowslice"),
        _build("int4zp-r1-rowslice", (5, 64), "int4_zp", 1, 32, tags={"layout"}, layout="rowslice"),
    ]
    return out


def _bytes_fwd(kw):
    d, s = kw["data"], kw["scale"]
    n = d.numel() * (2 if d.dtype == torch.uint8 else 1)
    return d.numel() * d.element_size() + s.numel() * 4 + n * (kw.get("dtype") or s.dtype).itemsize


def _bench_cases():
    return [_build("4096x4096-int8-channel", (4096, 4096), "int8", 1, 0),
            _build("4096x4096-int4-g128", (4096, 4096), "int4", 1, 128)]


SPEC = register_op(OpSpec(
    name=OP, fn=dequantize_blocks, ref=dequantize_blocks_ref, eager=dequantize_blocks_eager,
    kernels={"reference": "tessera.ops.dequantize.ref", "cpu": "tessera.ops.dequantize.cpu",
             "triton": "tessera.ops.dequantize.triton", "opencl": "tessera.ops.dequantize.opencl",
             "cpu:aarch64": "tessera.ops.dequantize.cross", "cpu:riscv64": "tessera.ops.dequantize.cross"},
    cases=_cases(), grad_inputs=(), bytes_fwd=_bytes_fwd, bench_cases=_bench_cases(),
    fuzz="test_quant_formats.py",  # inputs are codes + scales of coupled shapes: fuzzed there
))
