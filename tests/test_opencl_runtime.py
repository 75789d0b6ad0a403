"""The opencl backend's runtime (``tessera/backends/opencl.py``), apart from its kernels (those are
the matrix's: tests/test_matrix.py):

* device choice: ``TESSERA_OPENCL_DEVICE`` as a flat index, ``P:D`` or a name substring, on the real
  devices and on a made-up list (an index beats a name containing that digit); no match, no
  platform, or no pyopencl -> ``supports()`` False with the reason, an explicit request raises
  BackendError, automatic selection is untouched;
* the portable path: ``TESSERA_OPENCL_PORTABLE=1`` changes the build options (no ``cl_khr_fp16``
  arithmetic even on a device that has it; ``TSR_PORTABLE=1``), and a slice of the matrix passes
  with it, built with those options;
* the program binary cache: a second build loads the binary from disk, concurrent builds in
  several processes build once under the lock, and a damaged cache file is rebuilt, never handed
  to the driver (PoCL segfaults on a truncated binary).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tessera
from tessera import _registry
from tessera._registry import native_backends
from tessera.backends import opencl
from tessera.testing.matrix import run_case

HAVE_OPENCL = "opencl" in native_backends()
needs_opencl = pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device here (pip install 'tessera[opencl]')")
OPENCL_OPS = sorted(n for n, s in tessera.OPS.items() if "opencl" in s.kernels)
SKIP_TAGS = {"large", "extreme", "empty", "layout", "nograd"}

# a kernel of this file's own: the cache tests need a program nobody else builds
TWICE = '#include "tessera_cl.h"\n' \
        "__kernel void twice(__global float *y, __global const float *x, long n) {\n" \
        "    const long i = get_global_id(0);\n    if (i < n) y[i] = 2.0f * x[i];\n}\n"


@pytest.fixture
def fresh(monkeypatch):
    """No device choice or backend from the caller's environment; private selection memo."""
    for k in ("TESSERA_OPENCL_DEVICE", "TESSERA_OPENCL_PORTABLE", "TESSERA_BACKEND"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(_registry, "_selected", {})
    return monkeypatch


def _small(spec, dtype=torch.float32):
    case = next(c for c in spec.cases if not c.tags & SKIP_TAGS)
    return case.make(dtype, torch.device("cpu"), torch.Generator().manual_seed(0))


def _twice(src: Path) -> None:
    """Build (or load) ``src`` and check the kernel doubles a vector."""
    x = torch.randn(37)
    y = torch.full((37,), float("nan"))
    by = opencl.buffer(y)
    opencl.launch(opencl.program(src), "twice", (64,), None, [by, opencl.buffer(x), opencl.i64(37)], written=(by,))
    assert torch.equal(y, 2 * x)


# ---------------------------------------------------------------- device choice

@needs_opencl
def test_device_by_index_pd_and_name(fresh):
    """Every real device is found by its flat index, its P:D and its own name (case-insensitive)."""
    devs = opencl.devices()
    for i, (label, _, dev) in enumerate(devs):
        pd, name = label.split(" ", 1)
        for spec in (str(i), pd, dev.name.strip().upper()):
            got, why = opencl._pick(spec)
            assert got is not None and got[0] == label, (spec, why)
    sel, _ = opencl._pick("")
    assert "oclgrind" not in sel[0].lower(), "the simulator is never the default device"


@needs_opencl
def test_selected_device_runs_the_kernels(fresh):
    """TESSERA_OPENCL_DEVICE=P:D of the default device: the runtime uses it, and an op runs on it."""
    label = opencl._pick("")[0][0]
    fresh.setenv("TESSERA_OPENCL_DEVICE", label.split(" ", 1)[0])
    assert opencl.runtime().label == label
    spec = tessera.OPS[OPENCL_OPS[0]]
    with torch.no_grad():
        spec.fn(**_small(spec), backend="opencl")


class _FakeDevice:
    def __init__(self, gpu: bool):
        import pyopencl as cl
        self.type = cl.device_type.GPU if gpu else cl.device_type.CPU


@needs_opencl
def test_device_choice_on_a_made_up_list(fresh):
    """An index or P:D is matched over every device before any name substring ("2" is device 2, not
    an earlier device named "... 2"); the default is the first GPU that is not the simulator."""
    fake = [("0:0 Acme / Mali-G2 2", None, _FakeDevice(False)), ("0:1 Acme / Oclgrind GPU", None, _FakeDevice(True)),
            ("1:0 Other / Adreno 750", None, _FakeDevice(True)), ("1:1 Other / DSP", None, _FakeDevice(False))]
    fresh.setattr(opencl, "devices", lambda: fake)
    want = {"2": "1:0", "1:0": "1:0", "3": "1:1", "0:1": "0:1", "adreno": "1:0", "mali-g2 2": "0:0",
            "dsp": "1:1", "OTHER": "1:0", "": "1:0"}
    for spec, pd in want.items():
        got, why = opencl._pick(spec)
        assert got is not None and got[0].startswith(pd + " "), (spec, got, why)
    got, why = opencl._pick("9:9")
    assert got is None and "9:9" in why and "Adreno 750" in why and "Mali-G2" in why


@needs_opencl
def test_no_matching_device_is_a_clear_backend_error(fresh):
    spec = tessera.OPS[OPENCL_OPS[0]]
    kw = _small(spec)
    with torch.no_grad():
        spec.fn(**kw, backend="opencl")      # works first (and is memoised) ...
    fresh.setenv("TESSERA_OPENCL_DEVICE", "no-such-device-xyz")
    ok, why = _registry.supports(spec, "opencl", torch.device("cpu"), torch.float32)
    assert not ok and "TESSERA_OPENCL_DEVICE" in why and "no-such-device-xyz" in why
    with pytest.raises(tessera.BackendError, match="no-such-device-xyz"):   # ... then the choice is re-read
        spec.fn(**kw, backend="opencl")
    assert "opencl" not in native_backends()
    spec.fn(**kw)                            # automatic selection (cpu) is unaffected


@pytest.mark.parametrize("missing", ["platform", "pyopencl"])
def test_machine_without_opencl(fresh, missing):
    """No OpenCL platform (or no pyopencl): supports() is False with the reason, an explicit request
    raises BackendError, `tessera info` says why, and the other backends are untouched."""
    if missing == "platform":
        fresh.setattr(opencl, "devices", lambda: [])
        needle = "no OpenCL platform"
    else:
        fresh.setattr(opencl, "_importable", lambda: False)
        fresh.setattr(opencl, "devices", lambda: [])
        needle = "pyopencl is not installed"
    name = OPENCL_OPS[0] if OPENCL_OPS else sorted(tessera.OPS)[0]
    spec = tessera.OPS[name]
    ok, why = _registry.backend_available("opencl", torch.device("cpu"))
    assert not ok and needle in why
    if "opencl" in spec.kernels:
        assert not _registry.supports(spec, "opencl", torch.device("cpu"), torch.float32)[0]
    with pytest.raises(tessera.BackendError, match="opencl"):
        spec.fn(**_small(spec), backend="opencl")
    assert "opencl" not in native_backends()
    info = opencl.describe()
    assert info["selected"] is None and needle in info["why_not"]
    spec.fn(**_small(spec))


# ---------------------------------------------------------------- the portable path

@needs_opencl
def test_portable_env_changes_the_build_options(fresh):
    """With TESSERA_OPENCL_PORTABLE=1 a device with cl_khr_fp16 is built without fp16 arithmetic,
    and every build says TSR_PORTABLE=1 (different options, so a different cached binary)."""
    rt = opencl.runtime()
    seen = []
    fresh.setattr(rt, "programs", {})
    fresh.setattr(opencl, "_build", lambda rt, src, opts: seen.append(opts) or object())
    src = Path(tessera.__file__).parent / "ops" / "rms_norm" / "rms_norm.cl"
    for fp16 in (False, True):
        fresh.setattr(rt, "fp16", fp16)
        for portable in ("", "1"):
            fresh.setenv("TESSERA_OPENCL_PORTABLE", portable)
            rt.programs.clear()
            opencl.program(src, {"TSR_DTYPE": 1})
            assert f"-DTSR_PORTABLE={1 if portable else 0}" in seen[-1]
            assert f"-DTSR_HAS_FP16={int(fp16 and not portable)}" in seen[-1], seen[-1]
    assert len({tuple(o) for o in seen}) == 3  # fp16 device portable == no-fp16 device: same program


def _portable_cells():
    """Per opencl op: the dtype the portable switch matters for (fp16; an integer op its first) and
    its smallest plain, layout and extreme cases."""
    out = []
    for name in OPENCL_OPS:
        spec = tessera.OPS[name]
        dt = torch.float16 if torch.float16 in spec.dtypes else spec.dtypes[0]
        picked = {}
        for case in spec.cases:
            if "large" in case.tags or "empty" in case.tags:
                continue
            kind = "layout" if "layout" in case.tags else "extreme" if "extreme" in case.tags else "plain"
            picked.setdefault(kind, case)
        out += [pytest.param(spec, dt, c, id=f"{name}-{c.name}") for c in picked.values()]
    return out


@needs_opencl
@pytest.mark.parametrize("spec,dtype,case", _portable_cells())
def test_matrix_slice_on_the_portable_path(spec, dtype, case, fresh):
    fresh.setenv("TESSERA_OPENCL_PORTABLE", "1")
    seen = []
    real = opencl._build
    fresh.setattr(opencl, "_build", lambda rt, src, opts: seen.append(opts) or real(rt, src, opts))
    fresh.setattr(opencl.runtime(), "programs", {})  # every program of the cell is built (or loaded) here
    r = run_case(spec, "opencl", dtype, case)
    assert r.ok, r.why
    assert seen, "the cell built no program"
    assert all("-DTSR_PORTABLE=1" in o and "-DTSR_HAS_FP16=0" in o for o in seen), seen


# ---------------------------------------------------------------- the binary cache

def _cache_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "opencl").iterdir() if not p.name.endswith(".lock"))


class _CountSourceBuilds:
    """Wraps pyopencl.Program: counts programs created from source text (not from a binary)."""

    def __init__(self, monkeypatch):
        import pyopencl as cl
        opencl.runtime().zero_copy  # the runtime's own probe program is built before counting starts
        self.real, self.n = cl.Program, 0
        monkeypatch.setattr(cl, "Program", self)

    def __call__(self, ctx, *args):
        if len(args) == 1 and isinstance(args[0], str):
            self.n += 1
        return self.real(ctx, *args)


@needs_opencl
def test_second_build_loads_the_binary(fresh, tmp_path):
    fresh.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    src = tmp_path / "twice.cl"
    src.write_text(TWICE)
    fresh.setattr(opencl.runtime(), "programs", {})
    builds = _CountSourceBuilds(fresh)
    _twice(src)
    assert builds.n == 1 and len(_cache_files(tmp_path)) == 1
    opencl.runtime().programs.clear()     # a new process would start here: only the disk remembers
    _twice(src)
    assert builds.n == 1, "the second build compiled the source again instead of loading the binary"
    fresh.setenv("TESSERA_OPENCL_PORTABLE", "1")   # other options: another binary
    _twice(src)
    assert builds.n == 2 and len(_cache_files(tmp_path)) == 2


@needs_opencl
@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty", "bare-driver-binary"])
def test_damaged_cache_file_is_rebuilt(fresh, tmp_path, damage):
    fresh.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    src = tmp_path / "twice.cl"
    src.write_text(TWICE)
    fresh.setattr(opencl.runtime(), "programs", {})
    builds = _CountSourceBuilds(fresh)
    _twice(src)
    (name,) = _cache_files(tmp_path)
    f = tmp_path / "opencl" / name
    good = f.read_bytes()
    n = len(opencl._BIN_MAGIC) + 32
    bad = {"garbage": b"garbage!" * 64, "truncated": good[:len(good) // 2], "empty": b"",
           "flipped": good[:n + 100] + bytes(b ^ 0x5A for b in good[n + 100:n + 400]) + good[n + 400:],
           "bare-driver-binary": good[n:]}[damage]  # (the format before the digest header)
    f.write_bytes(bad)
    opencl.runtime().programs.clear()
    _twice(src)                           # PoCL would segfault on the truncated / flipped bytes
    assert builds.n == 2, "the damaged file was not rebuilt"
    fixed = f.read_bytes()           # written whole again: the digest matches the binary after it
    assert fixed.startswith(opencl._BIN_MAGIC) and hashlib.sha256(fixed[n:]).digest() == fixed[n - 32:n]
    opencl.runtime().programs.clear()
    _twice(src)
    assert builds.n == 2, "the rewritten file does not load"


_CONCURRENT = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import pyopencl as cl
    from tessera.backends import opencl
    src, ready = Path(sys.argv[1]), Path(sys.argv[2])
    real, n = cl.Program, [0]
    def counting(ctx, *args):
        if len(args) == 1 and isinstance(args[0], str):
            n[0] += 1
        return real(ctx, *args)
    cl.Program = counting
    opencl.runtime()                     # context first, then wait for the others: the builds start together
    (ready / str(os.getpid())).touch()
    t0 = time.time()
    while len(list(ready.iterdir())) < int(sys.argv[3]) and time.time() - t0 < 120:
        time.sleep(0.005)
    opencl.program(src)
    print(json.dumps({"source_builds": n[0]}))
""")


@needs_opencl
def test_concurrent_builds_build_once_under_the_lock(tmp_path):
    """Three processes asking for the same new program at the same moment: one compiles it, the
    others wait on the lock and load its binary; one cache file, no temporary left behind."""
    src = tmp_path / "twice.cl"
    src.write_text(TWICE)
    env = {**os.environ, "TESSERA_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TESSERA_OPENCL_PORTABLE", None)
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(src), str(ready), "3"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    builds = [json.loads(o.strip().splitlines()[-1])["source_builds"] for o, _ in outs]
    assert sum(builds) == 1, f"source builds per process: {builds} (the lock should make it exactly one)"
    assert len(_cache_files(tmp_path / "cache")) == 1, _cache_files(tmp_path / "cache")
