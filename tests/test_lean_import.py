"""``import tessera`` is lean: no triton or pyopencl import, no CUDA init, no OpenCL context, no
native build or load.

Each check runs in a fresh interpreter (this test process has long since imported
everything), with TRITON_INTERPRET unset and a private empty TESSERA_CACHE_DIR.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_PROBE = textwrap.dedent("""
    import json, os, sys
    import torch
    cuda_before = torch.cuda.is_initialized()
    import tessera
    import tessera.nn  # the modules are part of the public surface: they must be lean too
    ops = sorted(tessera.OPS)
    # touching the specs (cases, kernel module *names*) must not import kernels either
    kernels = {n: dict(s.kernels) for n, s in tessera.OPS.items()}
    print(json.dumps({
        "cuda_before": cuda_before,
        "cuda_initialized": torch.cuda.is_initialized(),
        "triton": sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.")),
        "pyopencl": sorted(m for m in sys.modules if m == "pyopencl" or m.startswith("pyopencl.")),
        # a context exists only through backends.opencl.runtime(): none may have been created
        "opencl_runtimes": len(getattr(sys.modules.get("tessera.backends.opencl"), "_runtimes", {})),
        "kernel_modules": sorted(m for m in sys.modules if m.startswith("tessera.ops.")
                                 and m.rsplit(".", 1)[-1] in ("cpu", "triton", "opencl")),
        "jit_imported": "tessera._jit" in sys.modules,
        "testing_modules": sorted(m for m in sys.modules if m.startswith("tessera.testing")),
        "loaded": sys.modules["tessera._jit"].loaded_libraries() if "tessera._jit" in sys.modules else [],
        "ops": ops,
        "cache_exists": os.path.exists(os.environ["TESSERA_CACHE_DIR"]),
        "cache_files": sorted(os.listdir(os.environ["TESSERA_CACHE_DIR"]))
                       if os.path.exists(os.environ["TESSERA_CACHE_DIR"]) else [],
    }))
""")


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TESSERA_BACKEND")}
    env["TESSERA_CACHE_DIR"] = str(tmp_path / "jit-cache")
    env.update(extra)
    return env


def _probe(tmp_path, **extra):
    p = subprocess.run([sys.executable, "-c", _PROBE], env=_env(tmp_path, **extra), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_import_is_lean(tmp_path):
    r = _probe(tmp_path)
    assert r["ops"], "no ops registered"
    assert r["triton"] == [], f"import tessera imported triton: {r['triton'][:5]}"
    assert r["pyopencl"] == [], f"import tessera imported pyopencl: {r['pyopencl'][:5]}"
    assert r["opencl_runtimes"] == 0, "import tessera created an OpenCL context"
    assert not r["cuda_before"] and not r["cuda_initialized"], "import tessera initialised CUDA"
    assert r["loaded"] == [], f"import tessera loaded native libraries: {r['loaded']}"
    assert not r["cache_exists"], "import tessera created the JIT cache directory"
    assert r["kernel_modules"] == [], f"import tessera imported kernel modules: {r['kernel_modules']}"
    assert r["cache_files"] == [], f"import tessera wrote to the JIT cache: {r['cache_files']}"
    # the library must not depend on its test helpers (specs build their cases from tessera._cases)
    assert r["testing_modules"] == [], f"import tessera imported its test helpers: {r['testing_modules']}"


def test_import_is_lean_with_interpreter_env(tmp_path):
    """Even with TRITON_INTERPRET=1 set, triton is imported only when a triton kernel first runs."""
    r = _probe(tmp_path, TRITON_INTERPRET="1")
    assert r["triton"] == []
    assert r["loaded"] == []


_FIRST_CALL = textwrap.dedent("""
    import json, os, sys
    import torch, tessera
    spec = tessera.OPS[sys.argv[1]]
    case = next(c for c in spec.cases if not c.tags)
    kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    spec.fn(**kw, backend="cpu")
    import tessera._jit
    print(json.dumps({"loaded": tessera._jit.loaded_libraries(),
                      "triton_kernels": sorted(m for m in sys.modules
                                               if m.startswith("tessera.ops.") and m.endswith(".triton")),
                      "cuda": torch.cuda.is_initialized(),
                      "files": sorted(os.listdir(os.environ["TESSERA_CACHE_DIR"]))}))
""")


def test_first_cpu_call_builds_only_its_library(tmp_path):
    """The control for the test above: a cpu call does build and load (exactly its own library)."""
    import tessera
    name = "rms_norm" if "rms_norm" in tessera.OPS else sorted(tessera.OPS)[0]
    # (TESSERA_FASTPATH=0: the C++ fast path's ~20 s first build is not this test's subject; its
    # files would be one more glue extension, see tests/test_fastpath.py)
    p = subprocess.run([sys.executable, "-c", _FIRST_CALL, name], env=_env(tmp_path, TESSERA_FASTPATH="0"),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(r["loaded"]) == 1 and r["loaded"][0].startswith(name + "-"), r["loaded"]
    # its kernel library, and the launch glue every cpu call uses (tessera/_fastcall.py)
    sos = [f for f in r["files"] if f.endswith(".so")]
    assert sorted(sos) == sorted([r["loaded"][0] + ".so"] + [f for f in sos if f.startswith("fastcall-")]), r["files"]
    assert len(sos) <= 2, r["files"]
    # (torch itself imports triton on the first custom-op call: its dynamo guard probes for the
    # package; so only tessera's own triton kernels are asserted absent here)
    assert r["triton_kernels"] == [] and not r["cuda"]


_FIRST_OPENCL_CALL = textwrap.dedent("""
    import json, os, sys
    import torch, tessera
    spec = tessera.OPS[sys.argv[1]]
    case = next(c for c in spec.cases if not c.tags)
    kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    with torch.no_grad():
        spec.fn(**kw, backend="opencl")
    from tessera.backends import opencl
    root = os.path.join(os.environ["TESSERA_CACHE_DIR"], "opencl")
    print(json.dumps({"pyopencl": "pyopencl" in sys.modules, "runtimes": len(opencl._runtimes),
                      "binaries": sorted(f for f in os.listdir(root) if f.endswith(".bin")),
                      "native": sys.modules["tessera._jit"].loaded_libraries() if "tessera._jit" in sys.modules else []}))
""")


def test_first_opencl_call_builds_only_its_program(tmp_path):
    """The control for the opencl side: the first opencl call imports pyopencl, creates one context
    and builds (and caches) exactly its own program, and builds no native cpu library."""
    import torch

    import tessera
    from tessera._registry import native_backends
    if "opencl" not in native_backends(torch.device("cpu")):
        pytest.skip("no OpenCL device here")
    name = "rms_norm" if "opencl" in tessera.OPS["rms_norm"].kernels else \
        next(n for n, s in sorted(tessera.OPS.items()) if "opencl" in s.kernels)
    p = subprocess.run([sys.executable, "-c", _FIRST_OPENCL_CALL, name], env=_env(tmp_path), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["pyopencl"] and r["runtimes"] == 1, r
    assert len(r["binaries"]) == 1, r["binaries"]   # one program (one dtype), built once
    assert r["native"] == [], f"an opencl call loaded native cpu libraries: {r['native']}"
