"""The README's Python examples run as written (each block in a fresh namespace, CPU)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i, capsys):
    exec(compile(BLOCKS[i], f"README.md python block {i}", "exec"), {"__name__": f"readme_{i}"})
