"""Named quantised formats, the :class:`QTensor` container, and tensor quantize / dequantize.

    qt = tessera.quant.quantize(x, "int4-g128")      # -> QTensor(fmt, data, scale, zero, shape)
    y  = qt.dequantize(torch.bfloat16)               # == tessera.quant.dequantize(qt, bf16)

Every format is one row of ``FORMATS`` (``FormatInfo``): the ``tessera::quantize_blocks`` /
``tessera::dequantize_blocks`` kind and scale-block shape it maps to, plus its memory layout.
x is [..., K] (fp32/fp16/bf16, any layout); "rows" are all leading dims flattened (M rows).
The integer contract (``tessera.quant.contract``) fixes every code, scale and zero bit for bit
on every backend.

| format              | data                              | scale                     | zero          |
|---------------------|-----------------------------------|---------------------------|---------------|
| int8-tensor         | int8 x.shape, -127..127           | fp32 []                   | -             |
| int8-channel        | int8 [N, K] (a weight, per row n) | fp32 [N]                  | -             |
| int8-token          | int8 [..., K] (per row/token)     | fp32 [...]                | -             |
| int16-tensor        | int16 x.shape, -32767..32767      | fp32 []                   | -             |
| int16-token         | int16 [..., K]                    | fp32 [...]                | -             |
| int4-g{32,64,128}   | uint8 [..., K/2] packed (1)       | fp32 [..., K/g]           | - (zero = 8)  |
| int4-g{..}-zp       | uint8 [..., K/2] packed (1)       | fp32 [..., K/g]           | uint8 [..., K/g] 0..15 |
| fp8-e4m3-tensor     | float8_e4m3fn x.shape             | fp32 []                   | -             |
| fp8-e4m3-row        | float8_e4m3fn [..., K]            | fp32 [...]                | -             |
| fp8-e4m3-block128   | float8_e4m3fn [N, K] (2-D)        | fp32 [ceil(N/128), ceil(K/128)] | -       |
| fp8-e5m2-*          | the same with float8_e5m2         |                           |               |
| fp8-e4m3fnuz-*      | the same with float8_e4m3fnuz (AMD: bias 8, QMAX 240, no -0, NaN 0x80)  | | |
| q4_0 (ggml)         | uint8 [..., K/2] packed (1)       | fp16 [..., K/32]          | - (zero = 8)  |
| q8_0 (ggml)         | int8 [..., K]                     | fp16 [..., K/32]          | -             |

(1) two 4-bit offset-binary codes per byte along K: byte j = code[2j] | code[2j+1] << 4 (low
nibble = even k); symmetric value = code - 8.  Group formats need K % g == 0 (q4_0/q8_0:
K % 32 == 0); the block128 formats take partial edge blocks.

Dequantisation is ``(q - zero) * scale`` in fp32 (zero 8 for symmetric 4-bit, 0 otherwise),
then rounded to the requested dtype.

ggml formats: the codes follow the contract on fp32 scales -- Q8_0: d = max(amax, 1e-12) / 127
(ggml: amax / 127); Q4_0: d = m / -8 with m the first value of largest magnitude (as ggml) --
and the stored scale is fp16(d) (round to nearest even), which dequantisation uses, as ggml
does.  Where tessera differs from ggml's C reference quantiser (``quantize_row_q{4,8}_0_ref``):
ggml multiplies by the reciprocal ``id = 1/d`` and rounds with ``roundf`` (Q8_0, half away
from zero) or ``(int)(x*id + 8.5f)`` (Q4_0, half up); tessera divides (correctly rounded) and
rounds half to even.  Codes can therefore differ by one step on exact ties and where x*(1/d)
and x/d round apart; the byte layout, the scale rule and dequantisation are ggml's (see
``tessera.quant.interop`` for the block bytes).  NaN inputs give code 0 (ggml: undefined).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Optional

import torch


class Format(str, enum.Enum):
    """The named formats (a ``str``: ``Format.INT4_G128 == "int4-g128"``)."""
    INT8_TENSOR = "int8-tensor"
    INT8_CHANNEL = "int8-channel"
    INT8_TOKEN = "int8-token"
    INT16_TENSOR = "int16-tensor"
    INT16_TOKEN = "int16-token"
    INT4_G32 = "int4-g32"
    INT4_G64 = "int4-g64"
    INT4_G128 = "int4-g128"
    INT4_G32_ZP = "int4-g32-zp"
    INT4_G64_ZP = "int4-g64-zp"
    INT4_G128_ZP = "int4-g128-zp"
    FP8_E4M3_TENSOR = "fp8-e4m3-tensor"
    FP8_E4M3_ROW = "fp8-e4m3-row"
    FP8_E4M3_BLOCK128 = "fp8-e4m3-block128"
    FP8_E5M2_TENSOR = "fp8-e5m2-tensor"
    FP8_E5M2_ROW = "fp8-e5m2-row"
    FP8_E5M2_BLOCK128 = "fp8-e5m2-block128"
    FP8_E4M3FNUZ_TENSOR = "fp8-e4m3fnuz-tensor"
    FP8_E4M3FNUZ_ROW = "fp8-e4m3fnuz-row"
    FP8_E4M3FNUZ_BLOCK128 = "fp8-e4m3fnuz-block128"
    Q4_0 = "q4_0"
    Q8_0 = "q8_0"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class FormatInfo:
    name: str
    qtype: str               # quantize_blocks kind
    block_rows: int          # rows per scale block (0 = all rows)
    block: int               # columns per scale block (0 = the whole row)
    data_dtype: torch.dtype
    scale_dtype: torch.dtype
    has_zero: bool
    granularity: str         # "tensor", "row", "group" or "block"
    group_divides: bool      # K must be a multiple of ``block``
    two_dim: bool = False    # x must be 2-D (2-D scale blocks)

    @property
    def packed(self) -> bool:
        return self.data_dtype == torch.uint8


def _table() -> dict[str, FormatInfo]:
    t = {}

    def add(name, qtype, br, bc, dt, gran, sdt=torch.float32, zero=False, div=False, two=False):
        t[name] = FormatInfo(name, qtype, br, bc, dt, sdt, zero, gran, div, two)

    for bits, dt in (("int8", torch.int8), ("int16", torch.int16)):
        add(f"{bits}-tensor", bits, 0, 0, dt, "tensor")
        add(f"{bits}-token", bits, 1, 0, dt, "row")
    add("int8-channel", "int8", 1, 0, torch.int8, "row")
    for g in (32, 64, 128):
        add(f"int4-g{g}", "int4", 1, g, torch.uint8, "group", div=True)
        add(f"int4-g{g}-zp", "int4_zp", 1, g, torch.uint8, "group", zero=True, div=True)
    for e, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2), ("e4m3fnuz", torch.float8_e4m3fnuz)):
        add(f"fp8-{e}-tensor", f"fp8_{e}", 0, 0, dt, "tensor")
        add(f"fp8-{e}-row", f"fp8_{e}", 1, 0, dt, "row")
        add(f"fp8-{e}-block128", f"fp8_{e}", 128, 128, dt, "block", two=True)
    add("q4_0", "q4_0", 1, 32, torch.uint8, "group", sdt=torch.float16, div=True)
    add("q8_0", "int8", 1, 32, torch.int8, "group", sdt=torch.float16, div=True)
    return t


FORMATS: dict[str, FormatInfo] = _table()


def format_info(fmt) -> FormatInfo:
    """The :class:`FormatInfo` of a format name (or :class:`Format`); ValueError if unknown."""
    name = fmt.value if isinstance(fmt, Format) else fmt
    if not isinstance(name, str):
        raise TypeError(f"tessera.quant: argument 'fmt' must be a format name (str), got {type(fmt).__name__}")
    if name not in FORMATS:
        raise ValueError(f"tessera.quant: argument 'fmt'={name!r} is not a format; expected one of {tuple(FORMATS)}")
    return FORMATS[name]


@dataclasses.dataclass
class QTensor:
    """A quantised tensor: ``data`` (codes), ``scale`` (and ``zero``) in the layout of ``fmt``;
    ``shape`` is the logical (dequantised) shape."""
    fmt: str
    data: torch.Tensor
    scale: torch.Tensor
    zero: Optional[torch.Tensor]
    shape: tuple

    @property
    def info(self) -> FormatInfo:
        return format_info(self.fmt)

    @property
    def nbytes(self) -> int:
        """Bytes of data + scale (+ zero)."""
        n = self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()
        return n + (0 if self.zero is None else self.zero.numel() * self.zero.element_size())

    def dequantize(self, dtype: torch.dtype = torch.float32, *, backend: Optional[str] = None) -> torch.Tensor:
        return dequantize(self, dtype, backend=backend)


def quantize(x: torch.Tensor, fmt, *, backend: Optional[str] = None) -> QTensor:
    """Quantise a float tensor into the named format (see the table in the module doc)."""
    info = format_info(fmt)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tessera.quant.quantize: argument 'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or (info.two_dim and x.dim() != 2):
        want = "2-D" if info.two_dim else "at least 1-D"
        raise ValueError(f"tessera.quant.quantize: argument 'x' (shape={tuple(x.shape)}) must be {want} for "
                         f"format {info.name!r}")
    if info.group_divides and x.shape[-1] % info.block:
        raise ValueError(f"tessera.quant.quantize: argument 'x' (shape={tuple(x.shape)}) must have a last dimension "
                         f"divisible by {info.block} for format {info.name!r}")
    from ..ops.quantize import quantize_blocks   # lazy: the ops import tessera.quant.contract
    out = quantize_blocks(x, info.qtype, info.block_rows, info.block, backend=backend)
    codes, scale = out[0], out[1]
    zero = out[2] if info.has_zero else None
    if info.scale_dtype != torch.float32:
        scale = scale.to(info.scale_dtype)          # ggml: fp16 scale, round to nearest even
    return QTensor(info.name, codes, scale, zero, tuple(x.shape))


def dequantize(qt: QTensor, dtype: torch.dtype = torch.float32, *, backend: Optional[str] = None) -> torch.Tensor:
    """``(q - zero) * scale`` in fp32, rounded to ``dtype`` (fp32, fp16 or bf16)."""
    if not isinstance(qt, QTensor):
        raise TypeError(f"tessera.quant.dequantize: argument 'qt' must be a QTensor, got {type(qt).__name__}")
    from ..ops.dequantize import dequantize_blocks
    info = qt.info
    return dequantize_blocks(qt.data, qt.scale, qt.zero, info.block_rows, info.block, dtype, backend=backend)
