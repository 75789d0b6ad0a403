"""The plain eager call of the hottest cpu ops in C++ (``csrc/fastpath.cpp``; issue #16 item 4).

A tiny eager ``tessera.silu`` cost ~14 us where ``F.silu`` costs ~1.2 us (layer_norm ~29 vs
~3 us, softmax ~18 vs ~1.4 us): Python glue, not the kernel.  Trimming the glue (``direct``,
``_env``, ``_fastcall``) brings it to ~9 us; no Python path gets near 2x, because one
``torch.empty`` alone costs ~1 us from Python.  So for the one case that dominates inference
(contiguous CPU tensors, the cpu backend picked automatically), ``silu``, ``gelu``,
``swiglu``, ``geglu``, ``softmax``, ``layer_norm``, ``rms_norm`` and ``int_mm`` run their
undecorated body in C++ (``conv2d``, ``conv2d_int8`` and ``linear_int8_requant`` too, by
replaying what their Python bodies did for the same signature: ``csrc/fastpath_conv2d.h``,
``csrc/fastpath_conv2d_int8.h``, ``csrc/fastpath_linear_int8.h``): ATen allocates the outputs and
the same C kernel entry point is
called with the same arguments as the Python launcher.  Everything else goes to the Python
body unchanged (the C++ function calls it), and :func:`tessera._library.direct` decides, as
before, whether the body may run outside the custom op at all, so autograd, compile/export,
opcheck and fake tensors never see this.  That decision is made in C++ too once the extension
has loaded (``gate``: the same queries, ~0.2 us instead of ~0.8 us), and the bodies are plain
METH_FASTCALL functions (pybind11's argument handling cost ~0.3 us a call).  The third cost
was the kernels' own: an OpenMP region costs libgomp ~0.55 us even for a team of one, so the
C kernels enter none below the parallel threshold (``TSR_TEAM`` in ``tessera_cpu.h``).

Built by the JIT on the cpu backend's first launch (``cpu.declare``), cached by source hash,
flags, compiler, torch version and Python ABI, under the JIT's lock: ~15-30 s once per
machine; ``import tessera`` builds nothing.  It needs a C++ compiler and torch's headers (in
every torch wheel).  Without them, or with ``TESSERA_FASTPATH=0`` set when it is first asked
for, every call takes the Python path (same results, the slower timing).  :func:`status` says
which, and why.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sysconfig
from pathlib import Path

import torch

from . import _jit, _library

_SRC = Path(__file__).parent / "csrc" / "fastpath.cpp"
_STATE: dict = {}  # "module": the extension or None; "why": why not
# op -> (module, its undecorated body, the extension's function of the same signature)
_OPS = {
    "silu": ("tessera.ops.silu", "_silu_impl"),
    "softmax": ("tessera.ops.softmax", "_softmax_impl"),
    "layer_norm": ("tessera.ops.layer_norm", "_layer_norm_impl"),
    "rms_norm": ("tessera.ops.rms_norm", "_rms_norm_impl"),
    "gelu": ("tessera.ops.gelu", "_gelu_impl"),
    "swiglu": ("tessera.ops.swiglu", "_swiglu_impl"),
    "geglu": ("tessera.ops.geglu", "_geglu_impl"),
    "int_mm": ("tessera.ops.int_mm", "_int_mm_impl"),
    "conv2d": ("tessera.ops.conv2d", "_conv2d_impl"),
    "conv2d_int8": ("tessera.ops.conv2d_int8", "_impl"),
    "add_int8": ("tessera.ops.add_int8", "_add_int8_impl"),
    "linear_int8_requant": ("tessera.ops.linear_int8_requant", "_impl"),
}
# what the dispatch rule reads (tessera.dispatch): the C++ conv2d twin replays a learned route only
# while none of these was replaced (csrc/fastpath_conv2d.h); thresholds()'s result is checked too
_CONV2D_RULE = ("thresholds", "defaults", "cpu_vendor", "mode", "route", "use_vendor", "conv_nk_min", "conv2d",
                "MIN_M", "NARROW_COUT", "NCHW_VENDOR_DTYPES", "CONV_NK_MIN", "CONV_NK_MIN_BY_VENDOR", "DEFAULTS",
                "DEFAULTS_INTEL")


def module():
    """The loaded extension, or None (built, loaded and bound on the first call)."""
    if "module" not in _STATE:
        _STATE["module"], _STATE["why"] = None, "loading"  # (another thread meanwhile: Python path)
        try:
            _STATE["module"], _STATE["why"] = _load()
        except Exception as e:  # an optimisation: whatever goes wrong, calls keep the Python path
            _STATE["why"] = f"{type(e).__name__}: {e}"
    return _STATE["module"]


def status() -> str:
    """'C++ fast path for <ops>' or 'off (<why>)'."""
    return f"C++ fast path for {', '.join(_OPS)}" if module() is not None else f"off ({_STATE['why']})"


def state() -> str:
    """:func:`status` without building anything: 'not loaded yet' before the first cpu launch."""
    return status() if "module" in _STATE else "not loaded yet (built on the first cpu launch)"


def calls() -> int:
    """How many calls the C++ bodies have run in this process (0 without the extension)."""
    mod = _STATE.get("module")
    return mod.calls() if mod is not None else 0


def learner(op: str):
    """The extension's ``learn_<op>`` (conv2d: ops/conv2d/cpu.py, conv2d_int8 and
    linear_int8_requant: ops/_requant/cpu.py tell it what each Python-path call did, for the C++
    twin to replay on the same signature: csrc/fastpath_*.h), or None: without the extension,
    and while a test places or poisons buffers (the twins never run then).  A vendor-route conv launches no kernel, so this is also
    where such a model loads the extension."""
    mod = module()
    if mod is None or _library._PLACE[0] is not None or _library._POISON[0]:
        return None
    return getattr(mod, f"learn_{op}")


def note(name: str, isa: str, address: int) -> None:
    """A kernel entry point the cpu backend has resolved (called by ``cpu.declare``)."""
    mod = _STATE.get("module")
    if mod is not None:
        mod.note(name, isa, address)


def _flags() -> tuple[list[str], str]:
    root = Path(torch.__file__).parent
    inc, lib = root / "include", root / "lib"
    py_inc = sysconfig.get_paths().get("include") or ""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = ["-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
             "-I", str(inc), "-I", str(inc / "torch" / "csrc" / "api" / "include"), "-I", py_inc,
             # (the JIT puts flags before the sources: --no-as-needed keeps these libraries)
             "-Wl,--no-as-needed", "-L", str(lib), f"-Wl,-rpath,{lib}",
             "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lstdc++"]
    suffix = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").strip(".").replace(".", "-")
    return flags, f"torch-{torch.__version__}-{suffix}"


def _load():
    if os.environ.get("TESSERA_FASTPATH", "") == "0":
        return None, "TESSERA_FASTPATH=0"
    if not (Path(torch.__file__).parent / "include" / "torch" / "extension.h").exists():
        return None, "torch's C++ headers are not installed"
    flags, key = _flags()
    try:
        path = _jit.built("fastpath", [_SRC], flags, key)
        loader = importlib.machinery.ExtensionFileLoader("_tsr_fastpath", str(path))
        spec = importlib.util.spec_from_file_location("_tsr_fastpath", str(path), loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except (_jit.BuildError, OSError, ImportError) as e:
        return None, f"could not build or load the extension: {str(e).splitlines()[0]}"
    from . import _registry
    from .backends import cpu
    try:
        from .ops._qlinear_int8 import MAX_K
        from .ops.softmax import cpu as softmax_cpu
        impls = {op: getattr(importlib.import_module(m), name) for op, (m, name) in _OPS.items()}
    except (ImportError, AttributeError) as e:  # an op's body renamed or moved: say so, run Python
        return None, f"cannot bind the ops' Python bodies: {e}"
    mod.configure(cpu._best_isa(), cpu.NT_MIN_BYTES, cpu.PARALLEL_MIN_ELEMENTS, int(softmax_cpu.SCRATCH_ELEMS), int(MAX_K),
                  _registry._override, impls)
    for where, address in list(cpu.entry_points.items()):  # declared before (or while) this loaded
        mod.note(*where, address)
    for op, impl in impls.items():
        _library._FAST[impl] = getattr(mod, op)
    from . import dispatch
    mod.configure_conv2d(dispatch, _CONV2D_RULE)
    mod.configure_gate(_library, os, _library._PROCESS_ENVIRON, torch.nn.Parameter)
    _library._GATE[0] = mod.gate
    return mod, ""
