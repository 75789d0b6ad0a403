"""Every CPU ISA level this machine can execute runs a subset of the matrix.

The native kernels are compiled once per ISA level (``avx512``, ``avx2``,
``generic``); ``TESSERA_CPU_ISA`` forces a lower level.  For each level, the
small cases of every op (all dtypes, forward and gradients, poisoned outputs)
run twice:

* ``plain``    -- the launch heuristics as shipped (small problems: one thread,
  normal stores); skipped for the best level, which ``tests/test_matrix.py`` runs;
* ``nt+omp``   -- non-temporal stores and the OpenMP team forced on for every
  size (``NT_MIN_BYTES``/``PARALLEL_MIN_ELEMENTS`` set to 0), so the streaming
  store paths (aligned body + unaligned head/tail) and the per-thread partial
  reductions of the backward kernels are exercised on small, odd shapes too.
"""
from __future__ import annotations

import pytest
import torch

import tessera
from tessera._registry import supports
from tessera.backends import cpu
from tessera.testing.matrix import run_case

MAX_NUMEL = 40_000


def _cases(spec, mode):
    """plain: every non-large case (extreme values hit the vector exp/erf paths per ISA);
    nt+omp: the store/reduction paths do not depend on values, so skip the extreme ones."""
    out = []
    for case in spec.cases:
        if "large" in case.tags or (mode == "nt+omp" and "extreme" in case.tags):
            continue
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        if sum(v.numel() for v in kw.values() if isinstance(v, torch.Tensor)) <= MAX_NUMEL:
            out.append(case)
    return out


def _params():
    out = []
    for level in cpu.supported_isas():
        # the default level with the shipped heuristics is what tests/test_matrix.py runs already
        modes = ("nt+omp",) if level == cpu.supported_isas()[0] else ("plain", "nt+omp")
        for mode in modes:
            for name, spec in sorted(tessera.OPS.items()):
                if "cpu" in spec.kernels:
                    out.append(pytest.param(level, mode, spec, id=f"{level}-{mode}-{name}"))
    return out


def test_machine_has_more_than_one_level():
    """On x86-64 at least avx2 + generic must be tested, or the ISA dispatch goes untested."""
    import platform
    if platform.machine() in ("x86_64", "AMD64"):
        assert len(cpu.supported_isas()) >= 2, cpu.supported_isas()


@pytest.mark.parametrize("level,mode,spec", _params())
def test_isa_level(level, mode, spec, monkeypatch):
    monkeypatch.setenv("TESSERA_CPU_ISA", level)
    if mode == "nt+omp":
        monkeypatch.setattr(cpu, "NT_MIN_BYTES", 0)
        monkeypatch.setattr(cpu, "PARALLEL_MIN_ELEMENTS", 0)
        if torch.get_num_threads() < 2:
            monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert cpu.isa() == level
    failures = []
    for case in _cases(spec, mode):
        for dtype in spec.dtypes:
            if not supports(spec, "cpu", torch.device("cpu"), dtype)[0]:
                continue
            r = run_case(spec, "cpu", dtype, case)
            if not r.ok:
                failures.append(f"{case.name}/{str(dtype)[6:]}: {r.why}")
    from tessera import _jit
    built = [k for k in _jit.loaded_libraries() if f"-{level}-" in k]
    assert built, f"no native library was loaded for ISA {level}: {_jit.loaded_libraries()}"
    assert not failures, f"{spec.name} at ISA {level} ({mode}):\n" + "\n".join(failures)


def test_forced_isa_validation(monkeypatch):
    monkeypatch.setenv("TESSERA_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="TESSERA_CPU_ISA"):
        cpu.isa()
    missing = [lv for lv in cpu.ISA_LEVELS if lv not in cpu.supported_isas()]
    if missing:
        monkeypatch.setenv("TESSERA_CPU_ISA", missing[0])
        with pytest.raises(ValueError, match="supports only"):
            cpu.isa()
