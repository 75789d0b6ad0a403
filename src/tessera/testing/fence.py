"""Inputs and outputs flush against an inaccessible page: a native kernel that reads one byte past
the end (or before the start) of a tensor it was given, or writes one byte past either end of a
buffer it fills, faults, instead of silently reading or overwriting a neighbour.

Why: the correctness matrix cannot see such reads (nor writes, below). An over-read lands in
whatever the allocator put next to the tensor, and a masked-off or padded lane often multiplies it
by zero, so outputs stay right while the kernel still touches memory it does not own (and crashes
the day that memory is unmapped). Here every tensor input of a cpu (or opencl) cell is copied into its
own anonymous mapping whose neighbouring page is ``PROT_NONE``, keeping its shape and strides (a
view of a wider buffer stays a view, a broadcast row stays stride 0); the cell then runs forward and
backward and must still pass. Every buffer the kernels write (outputs, gradients, workspaces: all
allocated with ``_library.new_output``) and the glue's copies (``rows()`` of a transposed input,
fp32 parameter copies, ``_library.contiguous``) are placed the same way through
``_library.placement``, so an unmasked store past the end of an output faults too (a write past the
end of a heap buffer usually lands in allocator slack and goes unseen until it corrupts a
neighbour).

The opencl backend is fenced the same way: its buffers are ``CL_MEM_USE_HOST_PTR`` over the
tensors' own memory, so on a zero-copy device (PoCL) a kernel reading or writing outside a buffer
touches the faulting page too (on a copying device the fence would only see the host side).

``python -m tessera.testing.fence OP [OP ...] [--backend cpu,opencl]`` runs every cell of OP on
those backends (default: the native backends that run here, less the Triton interpreter, whose
loads and stores are numpy's) twice, with the inputs, outputs and gradients ending at the fence
and then starting right after it (cases tagged ``large`` of backends other than cpu: at the end
only, see ``LARGE_BOTH_SIDES``), printing each cell's name before it runs: a fault kills the
process with SIGSEGV, and ``tests/test_fenced_reads.py`` reports the last
name printed. Upstream gradients of the backward pass are fenced the same way. Loads the kernels
mask off do not fault (AVX-512 masked loads suppress faults on masked lanes), and prefetches never
fault.
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


def _mapping(nbytes: int, side: str) -> torch.Tensor:
    """``nbytes`` uint8 of a fresh anonymous mapping, ending at (``"end"``) or starting right after
    (``"start"``) a ``PROT_NONE`` page."""
    body = -(-nbytes // PAGE) * PAGE
    mm = mmap.mmap(-1, body + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(mm, dtype=torch.uint8)  # keeps mm alive; unmapped with the last view
    guard, start = (raw.data_ptr() + body, body - nbytes) if side == "end" else (raw.data_ptr(), PAGE)
    if _libc.mprotect(guard, PAGE, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "fenced: mprotect failed")
    return raw[start:start + nbytes]


def fenced_empty(shape, dtype: torch.dtype, device, side: str = "end") -> torch.Tensor:
    """An uninitialised contiguous tensor (a ``_library.placement`` allocator) in memory that ends
    at (``side="end"``) or starts right after (``"start"``) a page that faults on any access.  The
    end of the data is the end of the page, so it is only element-aligned (4 KiB-aligned at the
    start side): kernels must not assume a 64-byte aligned output (tsr_store_row streams only
    when aligned).  Empty tensors and other devices get plain ``torch.empty``."""
    if side not in ("end", "start"):
        raise ValueError(f"fenced_empty: side={side!r} must be 'end' or 'start'")
    shape = tuple(shape)
    numel = 1
    for n in shape:
        numel *= n
    if torch.device(device).type != "cpu" or numel == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    return _mapping(numel * dtype.itemsize, side).view(dtype).view(shape)


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
    out = _mapping(nbytes, side).view(t.dtype).as_strided(t.shape, t.stride())
    # write through a view without the broadcast (stride-0) dims, so no element is written twice
    idx = tuple(slice(0, 1) if s == 0 else slice(None) for s in t.stride())
    out[idx].copy_(t.detach()[idx])
    return out


def run_cell(spec, backend: str, dtype: torch.dtype, case, side: str = "end"):
    """``matrix.run_case`` with every input, upstream gradient, kernel-written buffer and glue copy
    fenced on ``side``."""
    from .._library import placement
    from .matrix import run_case

    with placement(lambda shape, dt, dev: fenced_empty(shape, dt, dev, side)):
        return run_case(spec, backend, dtype, case, place=lambda t: fenced(t, side))


def fenced_backends() -> tuple[str, ...]:
    """The backends whose kernels touch tensor memory natively here: the native backends that run,
    less the Triton interpreter (its loads and stores are numpy's on CPU copies)."""
    from .._registry import CROSS_BACKENDS, native_backends
    # (the edge-CPU backends' kernels run on copies in their runner, behind its own guard zones;
    # the host copies exactly each tensor's span: tests/test_cross.py)
    return tuple(b for b in native_backends() if b != "triton" and b not in CROSS_BACKENDS)


# backends whose cases tagged "large" (> 4096-wide rows, long sequences) run fenced on both sides;
# the others run them at the end side only (a tail read past the end is the common slip; the
# small odd sizes cover both sides): the opencl large cells doubled the file's time on 2 cores
LARGE_BOTH_SIDES = ("cpu",)


def run_op(name: str, sides=("end", "start"), backends=None) -> int:
    """Every cell of op ``name`` on ``backends`` (default :func:`fenced_backends`) with fenced
    inputs, outputs and gradients; returns the number of failed cells."""
    import tessera  # noqa: F401  (registers the ops)
    from .matrix import cells

    bad = 0
    for side in sides:
        for spec, backend, dtype, case in cells(backends=tuple(backends or fenced_backends()), ops=[name]):
            if "large" in case.tags and side != "end" and backend not in LARGE_BOTH_SIDES:
                continue
            cell = f"{name}-{backend}-{str(dtype).replace('torch.', '')}-{case.name} [{side}]"
            print(cell, flush=True)
            r = run_cell(spec, backend, dtype, case, side)
            if not r.ok:
                bad += 1
                print(f"FAILED {cell}: {r.why}", flush=True)
    return bad


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tessera.testing.fence")
    ap.add_argument("ops", nargs="+")
    ap.add_argument("--backend", help="comma-separated backends (default: the native ones that run here)")
    a = ap.parse_args()
    bs = [b for b in (a.backend or "").split(",") if b] or None
    sys.exit(1 if sum(run_op(n, backends=bs) for n in a.ops) else 0)
