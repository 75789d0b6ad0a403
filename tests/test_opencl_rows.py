"""The opencl row kernels (rms_norm, layer_norm, softmax) under a GPU's work-group geometry.

On a CPU device (PoCL, where the suite runs) their launchers pick one work-item per row
(``backends.opencl.vec_local_size``): a work-item's float8 chunk loop is SIMD code there.  On a
GPU the same kernels run with up to 256 work-items per row, which splits a row's 8-element chunks
and its N % 8 tail across work-items and reduces through local memory -- code the matrix on PoCL
never reaches.  These tests force the GPU choice (and a small odd-ratio one) and run the op's
matrix cases against the float64 reference, forward and gradients, with the matrix's tolerances.
"""
from __future__ import annotations

import pytest
import torch

import tessera
from tessera._registry import backend_available
from tessera.testing.matrix import run_case

pytestmark = pytest.mark.skipif(not backend_available("opencl", torch.device("cpu"))[0],
                                reason="no OpenCL device")

OPS = ("rms_norm", "layer_norm", "softmax")


# the row lengths that split differently over work-items: 1, 7 (tail only), 123 (15 chunks +
# tail), 1025 (128 chunks + 1), 256 (whole chunks), 33 / 77 / 8200 (softmax's masked rows)
SIZES = {"1x1", "7x7", "3x5x123", "4x1025", "130x256", "res-3x5x123+res", "mask-3x8200", "2x8200"}


def _params():
    out = []
    for op in OPS:
        for case in tessera.OPS[op].cases:
            if "large" in case.tags or "empty" in case.tags:
                continue
            # every case in fp32 under the GPU geometry; the row lengths also in bf16 and under 4
            # work-items per row (kept few: each cell builds and runs forward and backward)
            cells = [("gpu", torch.float32)]
            if case.name in SIZES:
                cells += [("gpu", torch.bfloat16), ("4", torch.float32)]
            for geometry, dt in cells:
                out.append(pytest.param(op, case, dt, geometry, id=f"{op}-{case.name}-{str(dt)[6:]}-{geometry}"))
    return out


@pytest.mark.parametrize("op,case,dtype,geometry", _params())
def test_gpu_geometry(op, case, dtype, geometry, monkeypatch):
    from tessera.backends import opencl as cl
    if geometry == "gpu":  # what vec_local_size returns on a non-CPU device
        monkeypatch.setattr(cl, "vec_local_size", lambda n: cl.row_local_size(-(-n // 8)))
    else:                  # 4 work-items whatever the row: chunks and tail wrap around them
        monkeypatch.setattr(cl, "vec_local_size", lambda n: 4)
    r = run_case(tessera.OPS[op], "opencl", dtype, case)
    assert r.ok, r.why


def test_cpu_device_takes_one_work_item_per_row():
    """The geometry the matrix runs on PoCL (a CPU device): one work-item per row."""
    from tessera.backends import opencl as cl
    rt = cl.runtime()
    if rt.device.type & cl._cl().device_type.CPU:
        assert cl.vec_local_size(4096) == 1
    else:
        assert cl.vec_local_size(4096) == cl.row_local_size(512)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_parameter_gradients_are_deterministic(op):
    """dweight/dbias come from per-work-group partial rows added in group order: the same call
    gives the same bits every time (no atomics, no scheduling-dependent order)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 1031, generator=g)
    w = torch.randn(1031, generator=g)
    dy = torch.randn(300, 1031, generator=g)
    grads = []
    for _ in range(3):
        xx, ww = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if op == "rms_norm":
            y = tessera.rms_norm(xx, ww, backend="opencl")
            y.backward(dy)
            grads.append((xx.grad, ww.grad))
        else:
            bb = w.clone().requires_grad_(True)
            y = tessera.layer_norm(xx, ww, bb, backend="opencl")
            y.backward(dy)
            grads.append((xx.grad, ww.grad, bb.grad))
    for later in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(later, grads[0]))
