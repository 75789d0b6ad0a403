"""No cpu or opencl kernel reads or writes outside the tensors it is given (tessera.testing.fence).

Each op's cpu and opencl cells (the backends of ``fence.fenced_backends()`` that run here) run in a
child process with every input, upstream gradient, output, gradient,
workspace and glue copy (``rows()``, fp32 parameters) flush against a page that faults on access,
once ending at it and once starting right after it; a read or write past either end kills the
child with SIGSEGV, reported here with the cell that was running.  The cells must also still pass
the matrix's comparisons.  Planted kernels writing one element past an output or a gradient prove
the writes are fenced; a planted OpenCL kernel reading or writing one element past either end of a
fenced buffer proves the fence reaches the opencl kernels (zero-copy buffers over the tensors' own
memory: a device that copied them would not fault, and that test would fail).
"""
import signal
import subprocess
import sys

import pytest
import torch

from tessera._registry import OPS
from tessera.testing.fence import fenced, fenced_backends

FENCED = fenced_backends()
FENCED_OPS = sorted(n for n, s in OPS.items() if any(b in s.kernels for b in FENCED))


@pytest.mark.parametrize("op", FENCED_OPS)
def test_fenced_reads(op):
    backends = [b for b in FENCED if b in OPS[op].kernels]
    r = subprocess.run([sys.executable, "-m", "tessera.testing.fence", op, "--backend", ",".join(backends)],
                       capture_output=True, text=True, timeout=900)
    lines = r.stdout.splitlines()
    assert len(lines) > 0, f"{op}: no cell ran\n{r.stderr[-3000:]}"
    for b in backends:  # every fenced backend with a kernel for the op ran cells
        assert any(ln.startswith(f"{op}-{b}-") for ln in lines), f"{op}: no {b} cell ran\n{r.stderr[-3000:]}"
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        pytest.fail(f"{op}: {sig} while running {lines[-1]} (a read outside an input?)\n{r.stderr[-3000:]}")
    fails = [x for x in lines if x.startswith("FAILED")]
    assert r.returncode == 0 and not fails, f"{op}: exit {r.returncode}\n" + "\n".join(fails) + r.stderr[-3000:]


def _fault_in_child(code: str) -> int:
    return subprocess.run([sys.executable, "-c", "import torch\nfrom tessera.testing.fence import fenced\n" + code],
                          capture_output=True, timeout=300).returncode


def test_fence_faults_past_either_end():
    """The fence itself: reading one element past the end, or one before the start, faults."""
    assert _fault_in_child("t = fenced(torch.arange(1000.), 'end')\n"
                           "torch.as_strided(t, (1001,), (1,)).sum()") == -signal.SIGSEGV
    assert _fault_in_child("t = fenced(torch.arange(1000.), 'start')\n"
                           "torch.as_strided(t, (1,), (1,), t.storage_offset() - 1).sum()") == -signal.SIGSEGV
    assert _fault_in_child("t = fenced(torch.arange(1000.), 'end')\nprint(float(t.sum()))") == 0


_PLANT = """
import ctypes, importlib, sys
import torch
import tessera
from tessera._library import as_fp32_param
from tessera._registry import OPS
from tessera.testing.fence import run_cell
what, side = sys.argv[1], sys.argv[2]
op, case, dtype, fn = {
    "forward-write": ("silu", "3x5x123", torch.float32, "forward"),
    "backward-write": ("silu", "3x5x123", torch.float32, "backward"),
    "rows-read": ("silu", "transposed-5x3x123", torch.float32, "forward"),
    "param-read": ("rms_norm", "3x5x123", torch.bfloat16, "forward")}[what]
spec = OPS[op]
mod = importlib.import_module(spec.kernels["cpu"])
orig = getattr(mod, fn)


def touch(t, write):
    # one element past the end (or before the start) of t's memory, as an unmasked vector
    # load or store of a tail would touch it
    es = t.element_size()
    p = t.data_ptr() + (t.numel() * es if side == "end" else -es)
    ctypes.memset(p, 0, es) if write else ctypes.string_at(p, es)


def planted(*a, **k):
    if what == "rows-read":      # the glue's rows() copy of a transposed input
        assert a[0].is_contiguous() and a[0].stride(-1) == 1
        touch(a[0], False)
    if what == "param-read":     # the glue's fp32 copy of a bf16 weight
        touch(as_fp32_param(a[1]), False)
    out = orig(*a, **k)
    if what.endswith("write"):   # the buffer the kernel returns: an output, or a gradient
        touch(out if isinstance(out, torch.Tensor) else out[0], True)
    return out


setattr(mod, fn, planted)
r = run_cell(spec, "cpu", dtype, next(c for c in spec.cases if c.name == case), side)
print("survived", r.ok, r.why)
"""


@pytest.mark.parametrize("side", ["end", "start"])
@pytest.mark.parametrize("what", ["forward-write", "backward-write", "rows-read", "param-read"])
def test_fenced_planted_access_faults(what, side):
    """A kernel touching one element past either end of its output, of the gradient it fills, of the
    rows() copy of a transposed input or of the fp32 copy of a bf16 weight is killed by the fence:
    those buffers come from ``new_output`` / the glue helpers, which the fence places flush against
    the faulting page."""
    r = subprocess.run([sys.executable, "-c", _PLANT, what, side], capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGSEGV, (f"{what} one element past the {side} of its buffer went "
                                             f"unnoticed: exit {r.returncode}\n{r.stdout}{r.stderr[-3000:]}")


@pytest.mark.parametrize("side", ["end", "start"])
def test_fenced_keeps_layout(side):
    base = torch.randn(6, 10, dtype=torch.float64)
    view = base[1:5, 2:9:3]                                # a strided view of a wider buffer
    bcast = torch.randn(1, 7).expand(5, 7)                 # a broadcast row (stride 0)
    q8 = torch.randint(-128, 128, (3, 33), dtype=torch.int8)
    for t in (view, bcast, q8, torch.randn(17).to(torch.bfloat16)):
        f = fenced(t, side)
        assert f.shape == t.shape and f.stride() == t.stride() and f.dtype == t.dtype
        assert torch.equal(f, t)
        assert f.data_ptr() != t.data_ptr()
    empty = torch.empty(0, 4)
    assert fenced(empty, side) is empty


_OPENCL_PLANT = """
import sys
from pathlib import Path
import torch
from tessera.backends import opencl as cl
from tessera.testing.fence import fenced, fenced_empty
src = Path(sys.argv[1])
src.write_text('#include "tessera_cl.h"\\n'
               '__kernel void touch(__global float *y, __global const float *x, long n, long off, int wr) {'
               '  const long i = get_global_id(0); if (i >= n) return;'
               '  if (wr) y[i + off] = 1.0f; else y[i] = x[i + off]; }\\n')
for run in sys.argv[2:]:                  # side:what:offset, in turn
    side, what, off = run.split(":")
    y = fenced_empty((100,), torch.float32, "cpu", side)
    x = fenced(torch.randn(100), side)
    by = cl.buffer(y)
    cl.launch(cl.program(src), "touch", (100,), None,
              [by, cl.buffer(x), cl.i64(100), cl.i64(int(off)), cl.i32(what == "write")], written=(by,))
    print("survived", run, flush=True)
"""
_SIDES_WHATS = [(side, what) for side in ("end", "start") for what in ("read", "write")]


def _touch(tmp_path, *runs):
    return subprocess.run([sys.executable, "-c", _OPENCL_PLANT, str(tmp_path / "touch.cl"), *runs],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif("opencl" not in FENCED, reason="no OpenCL device here")
def test_fence_lets_opencl_kernels_work_in_bounds(tmp_path):
    """The control of the test below: the same kernel reading and writing every element of fenced
    buffers, on either side, exactly in bounds, runs."""
    r = _touch(tmp_path, *(f"{side}:{what}:0" for side, what in _SIDES_WHATS))
    assert r.returncode == 0 and r.stdout.count("survived") == 4, r.stdout + r.stderr[-3000:]


@pytest.mark.skipif("opencl" not in FENCED, reason="no OpenCL device here")
@pytest.mark.parametrize("side,what", _SIDES_WHATS)
def test_fence_reaches_opencl_kernels(side, what, tmp_path):
    """An OpenCL kernel touching one element past the end (or before the start) of a fenced buffer is
    killed: the opencl cells above are really fenced."""
    bad = _touch(tmp_path, f"{side}:{what}:{1 if side == 'end' else -1}")
    assert bad.returncode == -signal.SIGSEGV, (f"an OpenCL {what} one element past the {side} of a fenced buffer "
                                               f"went unnoticed: exit {bad.returncode}\n{bad.stdout}{bad.stderr[-3000:]}")
