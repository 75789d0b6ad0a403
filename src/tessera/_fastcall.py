"""A cheaper call path from Python into the cpu backend's C kernels (``csrc/fastcall.c``).

ctypes converts each argument of a declared function through Python-level ``from_param``
objects, ~0.19 us per argument here: ~1.9 us of a 9-argument launch whose kernel runs in
~0.05 us on a decode-sized input.  :func:`wrap` gives the same function as a small CPython
extension object that converts each argument with one C-API call and calls through libffi
(the library ctypes itself uses, so the ABI is the same), ~0.3 us per launch.  Any argument
it does not convert itself (a ctypes object, an int that does not fit the C type) sends that
call to the ctypes function unchanged, so ctypes' exact behaviour is kept at the edges.

The extension is built by the JIT on first use, like the kernels (cached by source hash,
flags, compiler and Python ABI, under the JIT's file lock; ``import tessera`` builds nothing).
It needs ``Python.h`` and ``ffi.h`` (Debian: ``python3-dev``/``libffi-dev``); where either is
missing, or ``TESSERA_FASTCALL=0`` is set when it is first asked for, :func:`wrap` returns the
ctypes function itself: slower, same results.  :func:`status` says which path is in use and why.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sysconfig
from pathlib import Path

from . import _env, _jit

_SRC = Path(__file__).parent / "csrc" / "fastcall.c"
_STATE: dict = {}  # "module": the extension or None; "why": the reason it is not in use


def module():
    """The loaded extension, or None (built and loaded on the first call; the answer is kept)."""
    if "module" not in _STATE:
        _STATE["module"], _STATE["why"] = None, "loading"  # (another thread meanwhile: ctypes)
        try:
            _STATE["module"], _STATE["why"] = _load()
        except Exception as e:  # an optimisation: whatever goes wrong, launches keep ctypes
            _STATE["why"] = f"{type(e).__name__}: {e}"
        if _STATE["module"] is not None:
            _env._C_GETENV.append(_STATE["module"].getenv)
    return _STATE["module"]


def status() -> str:
    """'fastcall' or 'ctypes (<why>)': for ``tessera info`` and benchmark headers."""
    return "fastcall" if module() is not None else f"ctypes ({_STATE['why']})"


def state() -> str:
    """:func:`status` without building anything: 'not loaded yet' before the first cpu launch."""
    return status() if "module" in _STATE else "not loaded yet (built on the first cpu launch)"


def wrap(fn: ctypes._CFuncPtr, spec: str):
    """``fn`` (a ctypes function whose argtypes follow ``spec``: p=pointer, l=int64, i=int32,
    f=float; returning a C int) as a fast callable, or ``fn`` itself without the extension."""
    mod = module()
    if mod is None:
        return fn
    try:
        return mod.wrap(ctypes.cast(fn, ctypes.c_void_p).value, spec, fn)
    except (ValueError, RuntimeError):  # a spec it does not take (> 32 arguments): ctypes does
        return fn


def _load():
    if os.environ.get("TESSERA_FASTCALL", "") == "0":
        return None, "TESSERA_FASTCALL=0"
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"no Python.h in {include!r} (install the Python development headers)"
    abi = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").strip(".").replace(".", "-")
    # (the JIT puts flags before the sources: --no-as-needed keeps the -lffi that comes first)
    flags = ["-O2", "-shared", "-fPIC", "-Wall", "-I", include, "-Wl,--no-as-needed", "-lffi"]
    try:
        path = _jit.built("fastcall", [_SRC], flags, abi)
    except (_jit.BuildError, OSError) as e:
        return None, f"could not build the extension ({str(e).splitlines()[0]}; is libffi-dev installed?)"
    loader = importlib.machinery.ExtensionFileLoader("_tsr_fastcall", str(path))
    spec = importlib.util.spec_from_file_location("_tsr_fastcall", str(path), loader=loader)
    try:
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except ImportError as e:
        return None, f"could not load the extension ({e})"
    return mod, ""
