"""Native CPU backend: runtime ISA choice, build flags, threads, ctypes launch helpers.

Kernels are framework-free C (``ops/<op>/*.c`` + ``csrc/tessera_cpu.h``) with a
plain C ABI: pointers, int64 sizes/strides, a dtype code and a thread count.
The same source is compiled once per ISA level:

* ``avx512``  -- x86-64 with AVX-512 F/BW/VL/DQ (512-bit vectors, NT stores)
* ``avx2``    -- x86-64 with AVX2 + FMA + F16C
* ``generic`` -- portable C at the compiler's baseline (SSE2 on x86-64, NEON on
  AArch64); also what a cross-compiled Arm/RISC-V build uses.

The level is detected at run time from the CPU's flags; ``TESSERA_CPU_ISA``
forces a lower one (tests run every level this machine can execute).
Threads follow ``torch.get_num_threads()``; small problems use one thread
because waking an OpenMP team costs more than the work.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
from pathlib import Path

import torch

from .. import _env, _fastcall, _fastpath, _jit

ISA_LEVELS = ("avx512", "avx2", "generic")
_BASE_FLAGS = ["-O3", "-std=c11", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno", "-ffp-contract=fast",
               "-fno-trapping-math", "-Wall", "-Werror=implicit-function-declaration"]
_ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
               "-mprefer-vector-width=512"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "generic": [],
}
# dtype codes shared with csrc/tessera_cpu.h
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# Below this many elements a call runs on one thread (OpenMP wake-up costs ~10-100 us here).
PARALLEL_MIN_ELEMENTS = 1 << 15


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def supported_isas() -> list[str]:
    """ISA levels this machine can execute, best first."""
    flags = cpu_flags()
    out = []
    if platform.machine() in ("x86_64", "AMD64"):
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"} <= flags:
            out.append("avx512")
        if {"avx2", "fma", "f16c"} <= flags:
            out.append("avx2")
    out.append("generic")
    return out


def isa() -> str:
    forced = _env.get("TESSERA_CPU_ISA")
    if not forced:
        return _best_isa()
    if forced not in ISA_LEVELS:
        raise ValueError(f"TESSERA_CPU_ISA={forced!r}: expected one of {ISA_LEVELS}")
    if forced not in supported_isas():
        raise ValueError(f"TESSERA_CPU_ISA={forced!r}: this CPU supports only {supported_isas()}")
    return forced


@functools.lru_cache(maxsize=None)
def _best_isa() -> str:
    return supported_isas()[0]


def available() -> tuple[bool, str]:
    if _jit.compiler() is None:
        return False, "no C compiler found to build the native kernels (install gcc or set CC)"
    return True, ""


_libs: dict[tuple[str, str, str], ctypes.CDLL] = {}


def library(name: str, source: Path) -> ctypes.CDLL:
    """Load (building on first use) the kernel library ``name`` for the current ISA.

    The per-process memo keeps the launch path free of hashing and file-system
    work: the source hash is computed once per (library, ISA) per process.
    """
    level = isa()
    key = (name, str(source), level)
    lib = _libs.get(key)
    if lib is None:
        lib = _libs[key] = _jit.load(name, [source], _BASE_FLAGS + _ISA_FLAGS[level] + ["-lm"], level)
        _lib_isa[lib._name] = level
    return lib


_lib_isa: dict[str, str] = {}  # library path -> the ISA level it was built for


def threads_for(numel: int) -> int:
    if numel < PARALLEL_MIN_ELEMENTS:
        return 1
    return max(1, torch.get_num_threads())


def ptr(t: torch.Tensor | None) -> int:
    """A tensor's data address as a plain int (0 for None): what a ``p`` argument takes (an int
    converts in one C-API call on the fast path; a ctypes object would send it to ctypes)."""
    return 0 if t is None else t.data_ptr()


_declared: dict[tuple[str, str, str], object] = {}


def declare(lib: ctypes.CDLL, fn: str, nargs_spec: str):
    """The C function ``fn`` of ``lib`` with argument types from a compact spec (p=pointer,
    l=int64, f=float, i=int32) returning a C int, as the cheapest callable this machine has:
    the ``_fastcall`` extension's (~0.3 us a launch) or, without it, ctypes (~0.2 us per
    argument).  Memoised: this is on every launch."""
    key = (lib._name, fn, nargs_spec)
    f = _declared.get(key)
    if f is None:
        kinds = {"p": ctypes.c_void_p, "l": ctypes.c_int64, "f": ctypes.c_float, "i": ctypes.c_int}
        c = getattr(lib, fn)
        if c.argtypes is None:
            c.argtypes = [kinds[k] for k in nargs_spec]
            c.restype = ctypes.c_int
        f = _declared[key] = _fastcall.wrap(c, nargs_spec)
        # the C++ fast path of the hottest ops calls the same entry points (built on this first
        # launch, like the kernels): tell it where this one is
        where = (fn, _lib_isa.get(lib._name, ""))
        entry_points[where] = ctypes.cast(c, ctypes.c_void_p).value
        if _fastpath.module() is not None:
            _fastpath.note(*where, entry_points[where])
    return f


entry_points: dict[tuple[str, str], int] = {}  # (C function, ISA level) -> address, as declared


def describe() -> dict:
    return {"isa": isa(), "isas_supported": supported_isas(), "machine": platform.machine(),
            "compiler": (_jit.compiler() or ("none", "none"))[1], "threads": torch.get_num_threads(),
            "launch": _fastcall.state(), "fastpath": _fastpath.state()}


# Outputs above this size are written with non-temporal stores (they would only evict the
# inputs from the cache); smaller outputs stay cached for the next op.
NT_MIN_BYTES = int(os.environ.get("TESSERA_NT_MIN_BYTES", 8 << 20))


def use_nt(out: torch.Tensor) -> int:
    return int(out.numel() * out.element_size() >= NT_MIN_BYTES)


EINVAL = -2  # TSR_EINVAL: a kernel found an argument out of range (it wrote nothing)


def check_rc(rc: int, what: str) -> None:
    if rc == -1:
        raise MemoryError(f"tessera cpu backend: {what}: out of memory for scratch buffers")
    if rc != 0:
        raise RuntimeError(f"tessera cpu backend: {what}: kernel returned error {rc}")
