"""Every OpenCL kernel on tiny cases under Oclgrind, the OpenCL simulator that checks each access.

``python -m tessera.testing.oclgrind OP [OP ...]`` runs the tiny cells of each op's opencl kernels
(:func:`tiny_cells`: every dtype, the smallest case of every argument signature and of the layout
and extreme cases, forward and backward through :func:`tessera.testing.matrix.run_case`) on the
Oclgrind device.  Run it with :data:`ENV` set (``tests/test_oclgrind.py`` does, in a subprocess):
Oclgrind then reports to stderr every out-of-bounds global, local or private access (its memory
checker is always on), every data race between work-items, within and across work-groups
(``OCLGRIND_DATA_RACES``), every work-group divergence at a barrier, and every failing API call
(``OCLGRIND_CHECK_API``).  Each cell's name goes to stdout and, as a ``=== cell`` marker, to
stderr, so :func:`reports` can say which cell a report came from.

Not enabled: ``OCLGRIND_UNINITIALIZED``.  Oclgrind 21.10's uninitialised-value plugin segfaults
on 8-wide vector code (a kernel building a ``float8`` from scalar loads, as ``tsr_ld8`` does), and
it marks the bytes of every ``CL_MEM_USE_HOST_PTR`` buffer uninitialised, so each load from a
tensor would be reported.  Reading memory a kernel never wrote is caught instead by the NaN
poison of every output the matrix compares (``tessera.testing.matrix``).

pyopencl's ``Program.build`` asks the device for parameters an OpenCL 1.2 device does not know
(``clGetDeviceInfo`` -> ``CL_INVALID_VALUE`` for 'param_name'), and on a program created from a
cached binary looks up its missing ``_source`` attribute, which its ``__getattr__`` turns into
``clCreateKernel(prg, "_source")`` (``CL_INVALID_KERNEL_NAME``): those API reports are pyopencl's
own, not a kernel's, and :func:`reports` drops exactly them.  Anything else on stderr is a report.

The last stdout line is JSON: the kernels launched and the program sources built, for
``tests/test_oclgrind.py``'s check that the tiny cells reach every ``__kernel`` in the sources.
"""
from __future__ import annotations

import json
import re
import sys

import torch

ENV = {"TESSERA_OPENCL_DEVICE": "oclgrind", "OCLGRIND_CHECK_API": "1", "OCLGRIND_DATA_RACES": "1",
       "OCLGRIND_MAX_ERRORS": "20"}
MAX_NUMEL = 4096       # tensor elements of a cell, all inputs together (Oclgrind runs ~1e5-1e6 ops/s)
CELL_MARK = "=== cell "


def _signature(kw: dict, tags) -> tuple:
    """Which arguments are tensors (with their dtypes) or None, the discrete options, the case kind."""
    sig = [("kind", "layout" if "layout" in tags else "extreme" if "extreme" in tags else
            "empty" if "empty" in tags else "plain")]
    for k, v in sorted(kw.items()):
        if isinstance(v, torch.Tensor):
            sig.append((k, str(v.dtype)))
        elif v is None or isinstance(v, (str, bool, int)):
            sig.append((k, repr(v)))
    return tuple(sig)


def tiny_cells(spec, backend: str = "opencl", max_numel: int = MAX_NUMEL):
    """[(dtype, case)]: per dtype of the backend's kernel module, the smallest case (all inputs <=
    ``max_numel`` elements, not ``large``) of every argument signature and case kind."""
    from .._registry import kernel_module
    out = []
    for dtype in kernel_module(spec, backend).DTYPES:
        best: dict[tuple, tuple[int, object]] = {}
        for case in spec.cases:
            if "large" in case.tags:
                continue
            kw = case.make(dtype, torch.device("cpu"), torch.Generator().manual_seed(0))
            n = sum(v.numel() for v in kw.values() if isinstance(v, torch.Tensor))
            if n > max_numel:
                continue
            sig = _signature(kw, case.tags)
            if sig not in best or n < best[sig][0]:
                best[sig] = (n, case)
        out += [(dtype, c) for _, c in best.values()]
    return out


def _instrument(record: dict) -> None:
    """Record the kernels launched and the program sources built."""
    from ..backends import opencl
    real_launch, real_program = opencl.launch, opencl.program

    def launch(prg, name, *a, **k):
        record["kernels"].add(name)
        return real_launch(prg, name, *a, **k)

    def program(source, defines=None):
        record["sources"].add(str(source))
        return real_program(source, defines)

    opencl.launch, opencl.program = launch, program


def run_ops(names: list[str]) -> int:
    """Run every tiny cell of ``names`` on the opencl backend; returns the number of failed cells."""
    import tessera  # noqa: F401  (registers the ops)
    from .._registry import OPS
    from .matrix import run_case

    record = {"kernels": set(), "sources": set()}
    _instrument(record)
    bad = 0
    for name in names:
        spec = OPS[name]
        for dtype, case in tiny_cells(spec):
            cell = f"{name}-opencl-{str(dtype).replace('torch.', '')}-{case.name}"
            print(cell, flush=True)
            print(CELL_MARK + cell, file=sys.stderr, flush=True)
            r = run_case(spec, "opencl", dtype, case)
            if not r.ok:
                bad += 1
                print(f"FAILED {cell}: {r.why}", flush=True)
    print(json.dumps({"kernels": sorted(record["kernels"]), "sources": sorted(record["sources"])}), flush=True)
    return bad


_PYOPENCL_NOISE = (("Function: clGetDeviceInfo", "Error:    CL_INVALID_VALUE", "For argument 'param_name'"),
                   ("Function: clCreateKernel", "Error:    CL_INVALID_KERNEL_NAME", "Kernel '_source' not found"))


def reports(stderr: str) -> list[str]:
    """Every report in ``stderr`` (each: the cell it came from, its first lines): Oclgrind's, or
    anything else a cell printed there, less pyopencl's own API misuse (module docstring)."""
    out, cell = [], "(before any cell)"
    blocks = re.split(r"\n\s*\n", stderr)
    for block in blocks:
        lines = [ln for ln in block.strip("\n").splitlines() if ln.strip()]
        if not lines:
            continue
        marks = [ln for ln in lines if ln.startswith(CELL_MARK)]
        if marks:
            cell = marks[-1][len(CELL_MARK):]
            lines = [ln for ln in lines if not ln.startswith(CELL_MARK)]
            if not lines:
                continue
        if lines[0].startswith("Oclgrind - OpenCL runtime error detected") and len(lines) == 4 and \
                any(all(n in ln for n, ln in zip(noise, lines[1:])) for noise in _PYOPENCL_NOISE):
            continue
        # anything else on stderr counts: an Oclgrind report, or a warning or traceback of the cell
        out.append(f"[{cell}] " + " | ".join(ln.strip() for ln in lines[:6]))
    return out


if __name__ == "__main__":
    sys.exit(1 if run_ops(sys.argv[1:]) else 0)
