"""tessera.max_pool2d_int8: max pooling of integer codes, bit-exact against PyTorch's max_pool2d
on float64 copies (the spec's reference) on every backend.

* every int8 code reaches the output unchanged, and padding never wins (windows of the minimum);
* layouts: channels-last in -> channels-last out, NCHW, strided views, unbatched input;
* bad inputs raise errors naming the argument (PyTorch's own geometry rules);
* hypothesis fuzz of shapes, windows and layouts against the reference (spec.fuzz).
The op-contract matrix (tests/test_matrix.py) runs the spec's cases on every backend as well.
"""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, backend_available
from tessera.testing.matrix import fuzz_spec

CPU = torch.device("cpu")
BACKENDS = [b for b in ("cpu", "triton") if backend_available(b, CPU)[0]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [torch.int8, torch.int16])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_max_pool2d_int8_resnet_stem_exact(backend, dt, layout):
    """ResNet's 3x3 / 2 / 1 pool over every code (one code per element, a permutation): the output
    is PyTorch's on the float copy, element for element, in x's format."""
    g = torch.Generator().manual_seed(1)
    lo = -128 if dt == torch.int8 else -32768
    n = 2 * 67 * 23 * 19
    x = (torch.randperm(n, generator=g) % (256 if dt == torch.int8 else 65536) + lo).to(dt).view(2, 67, 23, 19)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    y = tessera.max_pool2d_int8(x, 3, 2, 1, backend=backend)
    exp = F.max_pool2d(x.double(), 3, 2, 1).to(dt)
    assert y.dtype == dt and torch.equal(y, exp)
    assert y.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool2d_int8_padding_never_wins(backend):
    """All codes at the minimum with padding 1 and ceil_mode: an output may only be the minimum
    (PyTorch pads with -inf; a zero-padded kernel would give 0 or the zero point)."""
    x = torch.full((1, 5, 4, 6), -128, dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    y = tessera.max_pool2d_int8(x, 3, 2, 1, ceil_mode=True, backend=backend)
    assert y.shape == F.max_pool2d(x.float(), 3, 2, 1, ceil_mode=True).shape and bool((y == -128).all())


def test_max_pool2d_int8_errors():
    x = torch.zeros(1, 2, 5, 5, dtype=torch.int8)
    with pytest.raises(TypeError, match="'x'.*unsupported dtype"):
        tessera.max_pool2d_int8(x.float(), 2)
    with pytest.raises(ValueError, match="'x'.*at least 3"):
        tessera.max_pool2d_int8(x[0, 0], 2)
    with pytest.raises(ValueError, match="'padding'=\\(2, 2\\) must be at most half"):
        tessera.max_pool2d_int8(x, 3, 1, 2)
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        tessera.max_pool2d_int8(x, 3, 1, 0, 3)
    with pytest.raises(TypeError, match="'kernel_size'"):
        tessera.max_pool2d_int8(x, 2.0)
    with pytest.raises(ValueError, match="'stride'=\\(0, 0\\) must be >= 1"):
        tessera.max_pool2d_int8(x, 2, 0)
    with pytest.raises(TypeError, match="'ceil_mode' must be a bool"):
        tessera.max_pool2d_int8(x, 2, ceil_mode=1)


@st.composite
def _pool_inputs(draw):
    dt = draw(st.sampled_from([torch.int8, torch.int16]))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    H = draw(st.integers(dh * (kh - 1) + 1 - 2 * ph if dh * (kh - 1) + 1 - 2 * ph > 0 else 1, 12))
    W = draw(st.integers(dw * (kw - 1) + 1 - 2 * pw if dw * (kw - 1) + 1 - 2 * pw > 0 else 1, 12))
    N, C = draw(st.integers(0, 2)), draw(st.integers(1, 70))
    layout = draw(st.sampled_from(["contig", "channels_last", "strided"]))
    ceil = draw(st.booleans())

    def mk(dtype, device, gen):
        lo, hi = (-128, 127) if dt == torch.int8 else (-32768, 32767)
        x = torch.randint(lo, hi + 1, (N, C, H, W + 2), generator=gen, dtype=dt)
        x = x[..., 1:W + 1] if layout == "strided" else x[..., :W].contiguous()
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        return {"x": x, "kernel_size": (kh, kw), "stride": (sh, sw), "padding": (ph, pw), "dilation": (dh, dw),
                "ceil_mode": ceil}
    return dt, Case(f"fuzz-{N}x{C}x{H}x{W}-k{kh}x{kw}-s{sh}x{sw}-p{ph}x{pw}-d{dh}x{dw}-{layout}-{ceil}", mk)


@pytest.mark.fuzz
@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_max_pool2d_int8_vs_reference(backend):
    fuzz_spec("max_pool2d_int8", backend, _pool_inputs())
