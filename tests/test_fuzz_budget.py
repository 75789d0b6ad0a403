"""The fuzz budget: every hypothesis test is a `fuzz` test; `pytest -m fuzz` gives each op >= 1000
examples, the default run keeps the small bounded budget.

Checked by collecting the fuzz files in a subprocess (collection only: nothing is fuzzed here)
with TESSERA_FUZZ_REPORT set, so tests/conftest.py writes which tests were selected and their
effective ``max_examples``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tessera

TESTS = Path(__file__).resolve().parent
FILES = sorted({"test_fuzz.py"} | {s.fuzz for s in tessera.OPS.values() if s.fuzz != "rows"})


def _collect(tmp_path, *args):
    out = tmp_path / "fuzz.json"
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_FUZZ_EXAMPLES", "PYTEST_ADDOPTS")}
    env["TESSERA_FUZZ_REPORT"] = str(out)
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *args, *FILES], cwd=TESTS, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def fuzz_run(tmp_path_factory):
    return _collect(tmp_path_factory.mktemp("fuzz"), "-m", "fuzz")


def test_fuzz_run_gives_every_test_1000_examples(fuzz_run):
    assert fuzz_run["fuzz_run"] and fuzz_run["tests"], "`-m fuzz` selected no fuzz tests"
    small = {n: b for n, b in fuzz_run["tests"].items() if b < 1000}
    assert not small, f"under -m fuzz these hypothesis tests keep a small budget: {small}"


def test_fuzz_run_covers_every_op(fuzz_run):
    """Every op's fuzz file contributes tests to `-m fuzz`, and the generic row fuzz covers every
    `fuzz="rows"` op by name."""
    files = {n.split("::")[0].rsplit("/", 1)[-1] for n in fuzz_run["tests"]}
    assert not set(FILES) - files, f"no fuzz-marked test in {sorted(set(FILES) - files)}"
    rows = [n for n, s in sorted(tessera.OPS.items()) if s.fuzz == "rows"]
    generic = " ".join(n for n in fuzz_run["tests"] if "test_fuzz_cpu_vs_reference[" in n)
    assert not [n for n in rows if f"[{n}]" not in generic], "row-fuzzed ops missing from -m fuzz"


def test_default_run_keeps_the_small_budget(tmp_path):
    r = _collect(tmp_path)
    assert not r["fuzz_run"]
    big = {n: b for n, b in r["tests"].items() if b > 100}
    assert not big, f"the default run fuzzes with a large budget: {big}"


def test_every_budget_reads_the_fuzz_variable():
    """No hypothesis test hard-codes its budget: each max_examples goes through
    TESSERA_FUZZ_EXAMPLES (directly, or a module EXAMPLES read from it); only the Triton variant
    has its own (TESSERA_FUZZ_TRITON_EXAMPLES)."""
    fixed = []
    for path in sorted(TESTS.glob("test_*.py")):
        text = path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            if "max_examples=" not in line or path.name == "test_fuzz_budget.py":
                continue
            ok = "TESSERA_FUZZ_EXAMPLES" in line or "TRITON_EXAMPLES" in line or (
                "max_examples=EXAMPLES" in line and 'EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES"' in text)
            if not ok:
                fixed.append(f"{path.name}:{n}: {line.strip()}")
    assert not fixed, f"hypothesis budgets that -m fuzz cannot raise: {fixed}"
