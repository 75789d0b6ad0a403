"""No cpu kernel reads outside the tensors it is given (tessera.testing.fence).

Each op's cpu cells run in a child process with every input flush against a page that faults
on access, once ending at it and once starting right after it; a read past either end kills
the child with SIGSEGV, reported here with the cell that was running.  The cells must also
still pass the matrix's comparisons.
"""
import signal
import subprocess
import sys

import pytest
import torch

from tessera._registry import OPS
from tessera.testing.fence import fenced

CPU_OPS = sorted(n for n, s in OPS.items() if "cpu" in s.kernels)


@pytest.mark.parametrize("op", CPU_OPS)
def test_fenced_reads(op):
    r = subprocess.run([sys.executable, "-m", "tessera.testing.fence", op], capture_output=True, text=True,
                       timeout=900)
    lines = r.stdout.splitlines()
    assert len(lines) > 0, f"{op}: no cpu cell ran\n{r.stderr[-3000:]}"
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
