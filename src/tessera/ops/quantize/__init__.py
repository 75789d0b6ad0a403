"""Block-wise quantisation of a float tensor (``tessera.quantize_blocks``): one op for every
granularity of the named formats in :mod:`tessera.quant.formats`.

    codes, scale[, zero] = quantize_blocks(x, qtype, block_rows=1, block=0)

x [..., K] (fp32/fp16/bf16, any layout) is viewed as rows [M, K].  A scale block spans
``block_rows`` rows (1 = per row/token/channel, 0 = all rows) and ``block`` columns (0 = the
whole row); 2-D blocks (block_rows > 1, DeepSeek-V3 128x128) need a 2-D x.  Edge blocks are
partial.  ``qtype`` picks the code type and scale rule (``ref.py`` has the exact rules, which
are the integer contract of ``tessera.quant.contract``):

    int8, int16          symmetric, codes -QMAX..QMAX (QMAX 127 / 32767)
    int4                 symmetric, offset-binary codes 0..15 (q + 8), packed two per byte
    int4_zp              asymmetric with a uint8 zero point per block, packed
    q4_0                 ggml's Q4_0 scale rule (signed max / -8), codes like int4, packed
    fp8_e4m3, fp8_e5m2   float8_e4m3fn / float8_e5m2 codes (saturated, round to nearest even)
    fp8_e4m3fnuz         AMD's float8_e4m3fnuz (bias 8, QMAX 240; no -0: a negative value that
                         rounds to zero is code 0x00, 0x80 is NaN)

Outputs: codes (x.shape, or x.shape[:-1] + (K/2,) uint8 for the 4-bit kinds: byte j =
code[2j] | code[2j+1] << 4), an fp32 scale and, for int4_zp only, a uint8 zero of the scale's
shape.  Scale shape: block_rows 1 -> x.shape[:-1] (+ (ceil(K/block),) when block > 0);
block_rows 0 -> () (+ (ceil(K/block),)); block_rows > 1 -> (ceil(M/block_rows), ceil(K/block)).
Codes, scales and zeros are bit-identical on every backend.  No gradient.

Kernels: reference (torch, the contract), cpu (C: per-row blocks in one pass over a
cache-resident row, other blocks in two passes -- block statistics, then codes), triton
(statistics kernel + code kernel; fp8 through uint8 views, RNE with the interpreter-safe rint),
opencl (quantize.cl: per-row blocks in one kernel, other blocks statistics / merge / codes;
correctly rounded divisions on any device, csrc/opencl/tessera_quant_cl.h).

Roofline: read x once (twice for multi-row blocks), write the codes (+ scales).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ... import _checks
from ..._library import direct, rows
from ..._registry import Case, OpSpec, register_op, select
from ... import _cases as C
from .ref import QTYPES, grid, quantize2d

OP = "quantize_blocks"


def _check(x, qtype, block_rows, block):
    _checks.tensor(OP, "x", x)
    _checks.choice(OP, "qtype", qtype, tuple(QTYPES))
    for name, v in (("block_rows", block_rows), ("block", block)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"tessera.{OP}: argument '{name}'={v!r} must be an int >= 0")
    K = x.shape[-1]
    if K == 0:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must have a non-empty last dimension")
    if block_rows > 1 and x.dim() != 2:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must be 2-D for "
                         f"block_rows={block_rows} (2-D scale blocks)")
    if QTYPES[qtype][2] and K % 2:
        raise ValueError(f"tessera.{OP}: argument 'x' ({_checks.describe(x)}) must have an even last dimension "
                         f"for qtype {qtype!r} (two 4-bit codes per byte)")
    if qtype == "q4_0" and block_rows != 1:
        raise ValueError(f"tessera.{OP}: argument 'block_rows'={block_rows} must be 1 for qtype 'q4_0'")


def out_shapes(x_shape, qtype, block_rows, block):
    """(codes shape, scale shape) of a call (also the fake kernel's shapes)."""
    K = x_shape[-1]
    lead = tuple(x_shape[:-1])
    M = 1
    for d in lead:
        M *= d
    codes = lead + ((K // 2,) if QTYPES[qtype][2] else (K,))
    _, _, Mb, Kb = grid(M, K, block_rows, block)
    tail = (Kb,) if block else ()
    if block_rows == 1:
        scale = lead + tail
    elif block_rows == 0:
        scale = tail
    else:
        scale = (Mb, Kb)
    return codes, scale


def _quantize_blocks_impl(x: Tensor, qtype: str, block_rows: int, block: int,
                          backend: str) -> tuple[Tensor, Tensor, Tensor]:
    _check(x, qtype, block_rows, block)
    mod = select(SPEC, x.device, x.dtype, backend)
    cshape, sshape = out_shapes(x.shape, qtype, block_rows, block)
    codes, scale, zero = mod.forward(rows(x), qtype, block_rows, block)
    zero = x.new_empty(0, dtype=torch.uint8) if zero is None else zero.reshape(sshape)
    return codes.reshape(cshape), scale.reshape(sshape), zero


_quantize_blocks = torch.library.custom_op("tessera::quantize_blocks", mutates_args=())(_quantize_blocks_impl)


@_quantize_blocks.register_fake
def _(x, qtype, block_rows, block, backend):
    _check(x, qtype, block_rows, block)
    cshape, sshape = out_shapes(x.shape, qtype, block_rows, block)
    zero = x.new_empty(sshape if qtype == "int4_zp" else (0,), dtype=torch.uint8)
    return x.new_empty(cshape, dtype=QTYPES[qtype][0]), x.new_empty(sshape, dtype=torch.float32), zero


def quantize_blocks(x: Tensor, qtype: str = "int8", block_rows: int = 1, block: int = 0, *,
                    backend: str | None = None):
    """Quantise ``x`` block-wise; returns ``(codes, scale)``, or ``(codes, scale, zero)`` for
    ``qtype="int4_zp"``.  See the module docstring for shapes and rules."""
    _checks.python_types(OP, {"x": x})
    if not isinstance(qtype, str):
        raise TypeError(f"tessera.{OP}: argument 'qtype' must be a str, got {type(qtype).__name__}")
    codes, scale, zero = direct(_quantize_blocks, _quantize_blocks_impl, x)(
        x, qtype, block_rows, block, _checks.backend_arg(OP, backend))
    return (codes, scale, zero) if qtype == "int4_zp" else (codes, scale)


def quantize_blocks_ref(x, qtype="int8", block_rows=1, block=0):
    """The contract (fp32 math on the exact upcast of x), shaped like :func:`quantize_blocks`."""
    cshape, sshape = out_shapes(x.shape, qtype, block_rows, block)
    codes, scale, zero = quantize2d(x.reshape(-1, x.shape[-1]), qtype, block_rows, block)
    out = (codes.reshape(cshape), scale.reshape(sshape))
    return out + (zero.reshape(sshape),) if zero is not None else out


# ---------------------------------------------------------------- spec: cases, roofline

def _build(name, shape, qtype, block_rows, block, layout="contig", scale=1.0, tags=(), edit=None):
    def mk(dtype, device, gen):
        x = C.make(shape, dtype, device, gen, layout, scale)
        if edit is not None:
            x = edit(x.clone() if layout == "contig" else x)
        return {"x": x, "qtype": qtype, "block_rows": block_rows, "block": block}
    return Case(name, mk, frozenset(tags))


def _extremes(x):
    """Outliers, zero rows, NaN and inf: NaN -> code 0; inf -> scale inf, the block's codes 0."""
    f = x.view(-1, x.shape[-1])
    f[0, 0] = 1e4
    f[0, 3] = -1e4
    if f.shape[0] > 1:
        f[1] = 0
    if f.shape[0] > 2:
        f[2, 1] = float("nan")
    if f.shape[0] > 3:
        f[3, 2] = float("inf")
    return x


def _tie_rows(K):
    """Rows (float64) whose scale is exact, so that x / scale lands exactly on rounding ties.

    Each row repeats its block-maximum entry in every 32 columns (exact scale 1/8 in every
    group): int rows hold (n + 1/2) / 8 (rint must give 2 for 2.5, -2 for -2.5, 4 for 3.5),
    the zero-point / q4_0 row spans [-1, 0.875] (scale 1/8 for both rules), the fp8 rows hold
    midpoints between neighbouring e4m3 / e5m2 values, normal and subnormal."""
    j = torch.arange(K, dtype=torch.float64)
    halves = (j % 14 - 7) + 0.5
    k, e = j % 8, (j // 8) % 6 - 2
    e4 = torch.where(j % 3 == 0, (2 * k + 1) * 2.0 ** -10, (1 + (2 * k + 1) / 16) * 2.0 ** e)
    e5 = torch.where(j % 3 == 0, (2 * k + 1) * 2.0 ** -17, (1 + (2 * (k % 4) + 1) / 8) * 2.0 ** e)
    out = []
    for v, top in ((halves, 127.0), (halves, 7.0), (halves, 32767.0), (halves, None), (e4, 448.0), (e5, 57344.0)):
        v = v.clone()
        if top is None:
            v[30::32], v[31::32] = -8.0, 7.0        # amin -1, amax 0.875 after the / 8
        else:
            v[31::32] = top
        v[K - 1] = 7.0 if top is None else top
        out.append(v / 8.0)
    return torch.stack(out)


def _ties(x):
    f = x.view(-1, x.shape[-1])
    t = _tie_rows(f.shape[1])
    n = min(f.shape[0], t.shape[0])
    f[:n] = t[:n].to(f.dtype)
    return x


_KINDS = (("int8", 1, 0), ("int16", 1, 0), ("int8", 0, 0), ("int16", 0, 0), ("int4", 1, 32), ("int4_zp", 1, 32),
          ("int4", 1, 128), ("int4_zp", 1, 64), ("q4_0", 1, 32), ("int8", 1, 32),
          ("fp8_e4m3", 0, 0), ("fp8_e4m3", 1, 0), ("fp8_e4m3", 128, 128), ("fp8_e5m2", 1, 0),
          ("fp8_e5m2", 0, 0), ("fp8_e5m2", 128, 128), ("fp8_e4m3fnuz", 1, 0), ("fp8_e4m3fnuz", 128, 128))


def _cases():
    out = []
    for q, br, bc in _KINDS:
        tag = f"{q}-r{br}-c{bc}"
        K = 128 if q in ("q4_0",) or bc in (64, 128) else 96
        out.append(_build(f"{tag}-5x{K}", (5, K), q, br, bc))
        out.append(_build(f"{tag}-extreme", (6, K), q, br, bc, scale=3.0, tags={"extreme"}, edit=_extremes))
        out.append(_build(f"{tag}-ties", (6, K), q, br, bc, tags={"extreme"}, edit=_ties))
    out += [
        _build("int8-r1-1x1", (1, 1), "int8", 1, 0),
        _build("int8-r1-3x5x123", (3, 5, 123), "int8", 1, 0),
        _build("int8-r0-7x7", (7, 7), "int8", 0, 0),
        _build("int8-r1-c32-odd-7x123", (7, 123), "int8", 1, 32),           # partial last group
        _build("int4-r1-c32-3x4x64", (3, 4, 64), "int4", 1, 32),
        _build("int4zp-r1-c0-7x2", (7, 2), "int4_zp", 1, 0),
        _build("fp8-e4m3-blk-200x130", (200, 130), "fp8_e4m3", 128, 128, tags={"large"}),
        _build("fp8-e4m3-blk-9x11-b4", (9, 11), "fp8_e4m3", 4, 4),           # partial 2-D blocks
        _build("int8-blk-9x11-b3x0", (9, 11), "int8", 3, 0),
        _build("fp8-e5m2-r1-tiny", (4, 33), "fp8_e5m2", 1, 0, scale=1e-30),  # subnormal-range inputs
        _build("int16-r0-1025", (4, 1025), "int16", 0, 0),
        _build("int4-r1-c128-large", (64, 4096), "int4", 1, 128, tags={"large"}),
        _build("int8-r1-empty", (0, 64), "int8", 1, 0, tags={"empty"}),
        _build("int8-r0-empty", (0, 64), "int8", 0, 0, tags={"empty"}),
        _build("int4zp-r1-c32-empty", (0, 64), "int4_zp", 1, 32, tags={"empty"}),
    ]
    for layout in C.LAYOUTS[1:]:
        out.append(_build(f"int8-r1-{layout}-5x3x124", (5, 3, 124), "int8", 1, 0, layout, tags={"layout"}))
        out.append(_build(f"int4zp-r1-c32-{layout}", (5, 3, 64), "int4_zp", 1, 32, layout, tags={"layout"}))
    out.append(_build("fp8-r0-transposed", (33, 20), "fp8_e4m3", 0, 0, "transposed", tags={"layout"}))
    return out


def _bytes_fwd(kw):
    x = kw["x"]
    codes, scale = out_shapes(x.shape, kw["qtype"], kw["block_rows"], kw["block"])
    ncodes = 1
    for d in codes:
        ncodes *= d
    passes = 1 if kw["block_rows"] == 1 else 2
    return passes * x.numel() * x.element_size() + ncodes * QTYPES[kw["qtype"]][0].itemsize


def _bench_cases():
    return [_build("4096x4096-int8-channel", (4096, 4096), "int8", 1, 0),
            _build("4096x4096-int8-tensor", (4096, 4096), "int8", 0, 0),
            _build("4096x4096-int4-g128", (4096, 4096), "int4", 1, 128),
            _build("4096x4096-fp8-block128", (4096, 4096), "fp8_e4m3", 128, 128)]


SPEC = register_op(OpSpec(
    name=OP, fn=quantize_blocks, ref=quantize_blocks_ref, eager=quantize_blocks_ref,
    kernels={"reference": "tessera.ops.quantize.ref", "cpu": "tessera.ops.quantize.cpu",
             "triton": "tessera.ops.quantize.triton", "opencl": "tessera.ops.quantize.opencl",
             "cpu:aarch64": "tessera.ops.quantize.cross", "cpu:riscv64": "tessera.ops.quantize.cross"},
    cases=_cases(), grad_inputs=(), bytes_fwd=_bytes_fwd, bench_cases=_bench_cases(),
    # the scale (output 1) is fp32 whatever x's dtype, and part of the format: the contract fixes
    # it bit for bit (one correctly rounded fp32 division), so it is compared with zero tolerance
    out_dtypes={1: torch.float32}, fp32_tol={1: (0.0, 0.0)},
    fuzz="test_quant_formats.py",  # options (qtype x block shape) are coupled: fuzzed there
))
