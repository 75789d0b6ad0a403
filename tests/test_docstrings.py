"""Op docstrings state formulas, numerics and design reasons; measured figures (ms, GB/s,
"1.3x faster", "% of the read pass") go stale there, so they live in ``benchmarks/results/``
(with the command that produced them) and the README, and the docstrings point to them."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

OPS = Path(__file__).resolve().parents[1] / "src" / "tessera" / "ops"
FIGURE = re.compile(r"\b\d+(\.\d+)?\s?(ms|us|GB/s|GFLOP/s)\b|\d(\.\d+)?x (faster|slower)"
                    r"|\b\d+(-\d+)?% of (the |its )?(layout|read|copy|linear|dot)")


@pytest.mark.parametrize("path", sorted(OPS.glob("*/__init__.py")), ids=lambda p: p.parent.name)
def test_op_docstring_has_no_benchmark_log(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    hits = [line.strip() for line in doc.splitlines() if FIGURE.search(line)]
    assert not hits, f"{path.parent.name}: measured figures in the docstring (move them to benchmarks/results/): {hits}"


def test_the_pattern_finds_a_log():
    assert FIGURE.search("B=1 x 16384 tokens (64 MiB) in 3.4 ms, 54x gather + SDPA")
    assert FIGURE.search("int8 KV at 48-71% of its layout read") and FIGURE.search("1.30-1.60x faster than bf16")
    assert not FIGURE.search("error <= 2^-16 of its max, 32 keys for 16/32-bit caches")
