"""The cross-backend correctness matrix, generated from the op specs.

One test per (op, backend, dtype, case): forward outputs (poisoned before the
call) and input gradients against the float64 reference, with the tolerance
rule of ``tessera.testing.tolerance``.  Cases tagged ``large`` are skipped under
the Triton interpreter (it runs ~3 ms per program).
"""
import pytest
import torch

import tessera  # noqa: F401  (registers the ops)
from tessera.backends import triton as triton_backend
from tessera._registry import CROSS_BACKENDS
from tessera.testing.cross_slice import in_default_slice
from tessera.testing.matrix import cells, run_case


def _params():
    out = []
    for spec, backend, dtype, case in cells():
        if backend == "triton" and triton_backend.interpreted() and "large" in case.tags:
            continue
        dt = str(dtype).replace("torch.", "")
        # edge-CPU backends run emulated: a slice by default, every cell with `pytest -m cross`
        marks = (pytest.mark.cross,) if backend in CROSS_BACKENDS and not in_default_slice(spec, dtype, case) else ()
        out.append(pytest.param(spec, backend, dtype, case, id=f"{spec.name}-{backend}-{dt}-{case.name}", marks=marks))
    return out


@pytest.mark.parametrize("spec,backend,dtype,case", _params())
def test_matrix(spec, backend, dtype, case):
    r = run_case(spec, backend, dtype, case)
    assert r.ok, r.why
