"""Inputs flush against an inaccessible page: a native kernel that reads one byte past the end
(or before the start) of a tensor it was given faults, instead of silently reading a neighbour.

Why: the correctness matrix cannot see such reads.  An over-read lands in whatever the allocator
put next to the tensor, and a masked-off or padded lane often multiplies it by zero, so outputs
stay right while the kernel still touches memory it does not own (and crashes the day that memory
is unmapped).  Here every tensor input of a cpu-backend cell is copied into its own anonymous
mapping whose neighbouring page is ``PROT_NONE``, keeping its shape and strides (a view of a wider
buffer stays a view, a broadcast row stays stride 0); the cell then runs forward and backward and
must still pass.

``python -m tessera.testing.fence OP`` runs every cpu cell of OP twice, with the inputs ending at
the fence and then starting right after it, printing each cell's name before it runs: a fault kills
the process with SIGSEGV, and ``tests/test_fenced_reads.py`` reports the last name printed.
Upstream gradients of the backward pass are fenced the same way.  Loads the kernels mask off do
not fault (AVX-512 masked loads suppress faults on masked lanes), and prefetches never fault.
"""
from __future__ import annotations

import ctypes
import mmap
import sys

import torch

PAGE = mmap.PAGESIZE
_PROT_NONE = 0
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _span(t: torch.Tensor) -> int:
    """Elements between the first and the last one t addresses, inclusive."""
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def fenced(t, side: str = "end"):
    """A copy of CPU tensor ``t`` with its shape and strides, whose memory ends at (``side="end"``)
    or starts right after (``"start"``) a page that faults on any access.  Anything else (not a
    tensor, another device, no elements) is returned as it is."""
    if side not in ("end", "start"):
        raise ValueError(f"fenced: side={side!r} must be 'end' or 'start'")
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
        return t
    if any(s < 0 for s in t.stride()):
        raise ValueError(f"fenced: negative strides {t.stride()} are not supported")
    nbytes = _span(t) * t.element_size()
    body = -(-nbytes // PAGE) * PAGE
    mm = mmap.mmap(-1, body + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(mm, dtype=torch.uint8)  # keeps mm alive; unmapped with the last view
    guard, start = (raw.data_ptr() + body, body - nbytes) if side == "end" else (raw.data_ptr(), PAGE)
    if _libc.mprotect(guard, PAGE, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "fenced: mprotect failed")
    out = raw[start:start + nbytes].view(t.dtype).as_strided(t.shape, t.stride())
    # write through a view without the broadcast (stride-0) dims, so no element is written twice
    idx = tuple(slice(0, 1) if s == 0 else slice(None) for s in t.stride())
    out[idx].copy_(t.detach()[idx])
    return out


def run_op(name: str, sides=("end", "start")) -> int:
    """Every cpu cell of op ``name`` with fenced inputs; returns the number of failed cells."""
    import tessera  # noqa: F401  (registers the ops)
    from .matrix import cells, run_case

    bad = 0
    for side in sides:
        for spec, backend, dtype, case in cells(backends=("cpu",), ops=[name]):
            cell = f"{name}-{backend}-{str(dtype).replace('torch.', '')}-{case.name} [{side}]"
            print(cell, flush=True)
            r = run_case(spec, backend, dtype, case, place=lambda t: fenced(t, side))
            if not r.ok:
                bad += 1
                print(f"FAILED {cell}: {r.why}", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(1 if sum(run_op(n) for n in sys.argv[1:]) else 0)
