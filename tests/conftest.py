"""Test setup: the Triton backend runs under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is imported anywhere; tessera
imports triton lazily, so setting it here (before any test module imports an
op's triton kernels) is enough.  Set TESSERA_TEST_TRITON=0 to skip Triton.
"""
import os

if os.environ.get("TESSERA_TEST_TRITON", "1") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TESSERA_SEED", "0")
# The cpu backend's conv2d and quantized linears may hand a call to oneDNN under the default
# `auto` dispatch (tessera/dispatch.py), by a rule that differs per machine: the suite pins
# tessera's own kernels so the contract matrix checks them on every machine alike;
# tests/test_dispatch.py checks the vendor routes and `auto` explicitly.
os.environ.setdefault("TESSERA_DISPATCH", "kernel")
# The interpreter runs tl.dot through numpy's BLAS; its worker threads thrash when two pytest
# workers share two cores (measured: ~40% of the interpreted attention kernels' CPU time).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.manual_seed(0)


# ---------------------------------------------------------------- the fuzz budget
# Every hypothesis test is a `fuzz` test: marked here when @given decorates it, with
# @pytest.mark.fuzz when it builds its @given inside the body (one per parametrized op).  Each
# reads its budget as max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "<small default>")):
# the default run keeps 25-60 examples a test (bounded CI time); `pytest -m fuzz` selects only
# the fuzz tests and sets TESSERA_FUZZ_EXAMPLES=1000 (unless set) before any test module is
# imported, so every op gets >= 1000 examples.  The Triton variant keeps its own budget
# (TESSERA_FUZZ_TRITON_EXAMPLES): the interpreter runs ~100x slower.
FUZZ_EXAMPLES = 1000


def _fuzz_run(config) -> bool:
    expr = config.getoption("markexpr", "") or ""
    return "fuzz" in expr and "not fuzz" not in expr


def pytest_configure(config):
    if _fuzz_run(config):
        os.environ.setdefault("TESSERA_FUZZ_EXAMPLES", str(FUZZ_EXAMPLES))


def pytest_collection_modifyitems(config, items):
    import pytest
    from hypothesis import is_hypothesis_test
    report = {}
    for item in items:
        fn = getattr(item, "obj", None)
        if fn is not None and is_hypothesis_test(fn):
            item.add_marker(pytest.mark.fuzz)
            # (hypothesis has no public getter for a test's settings: the report reads its attribute)
            report[item.nodeid] = fn._hypothesis_internal_use_settings.max_examples
        elif item.get_closest_marker("fuzz") is not None:
            report[item.nodeid] = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", -1))
    path = os.environ.get("TESSERA_FUZZ_REPORT")
    if path:  # tests/test_fuzz_budget.py: which tests a run selects as fuzz, with their budgets
        import json
        with open(path, "w") as f:
            json.dump({"fuzz_run": _fuzz_run(config), "tests": report}, f)


# ---------------------------------------------------------------- the C++ fast path
@pytest.fixture(scope="module")
def fast():
    """tessera._fastpath, built and loaded (tests/test_fastpath*.py); skipped only where it is
    turned off or torch's headers are missing, a failure where it should have built."""
    import tessera
    from tessera import _fastpath
    tessera.silu(torch.randn(2, 3))  # the first cpu launch builds and loads the extensions
    if _fastpath.module() is None:
        why = _fastpath.status()
        if "TESSERA_FASTPATH=0" in why or "headers" in why:
            pytest.skip(why)
        pytest.fail(f"the C++ fast path did not build here: {why}")
    return _fastpath
