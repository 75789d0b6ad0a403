"""The native build cache (``tessera._jit``): keys, concurrent builds, build errors.

Every test uses its own ``TESSERA_CACHE_DIR`` under pytest's tmp_path, so xdist
workers never share a cache and the user's cache is never touched.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tessera import _jit
from tessera.backends import cpu

pytestmark = pytest.mark.skipif(_jit.compiler() is None, reason="no C compiler")

FLAGS = ["-O1", "-std=c11", "-shared", "-fPIC"]


def _source(dirpath: Path, name: str, body: str) -> Path:
    p = dirpath / f"{name}.c"
    p.write_text(body)
    return p


def _big_source(n_funcs: int = 300) -> str:
    """A source that takes a moment to compile, so concurrent builds really overlap."""
    funcs = [f"double f{i}(double x) {{ double s = {i}; for (int k = 0; k < {i % 7 + 2}; ++k) "
             f"s = s * x + k; return s; }}" for i in range(n_funcs)]
    return "\n".join(funcs) + "\nint answer(void) { return 42; }\n"


def test_key_depends_on_source_flags_isa_and_headers(tmp_path, monkeypatch):
    src = _source(tmp_path, "k", "int f(void) { return 1; }\n")
    k0 = _jit._key("k", [src], FLAGS, "generic")
    assert k0 == _jit._key("k", [src], FLAGS, "generic"), "key is not deterministic"
    assert k0.startswith("k-generic-")
    assert _jit._key("k", [src], FLAGS + ["-DX=1"], "generic") != k0, "flags not in the key"
    assert _jit._key("k", [src], FLAGS, "avx2") != k0, "ISA not in the key"
    src.write_text("int f(void) { return 2; }\n")
    assert _jit._key("k", [src], FLAGS, "generic") != k0, "source not in the key"
    src.write_text("int f(void) { return 1; }\n")
    assert _jit._key("k", [src], FLAGS, "generic") == k0
    # a shared header edit must invalidate every library built with it
    hdrs = tmp_path / "csrc"
    shutil.copytree(_jit.CSRC, hdrs)
    monkeypatch.setattr(_jit, "CSRC", hdrs)
    k1 = _jit._key("k", [src], FLAGS, "generic")
    h = next(hdrs.glob("*.h"))
    h.write_text(h.read_text() + "\n/* edited */\n")
    assert _jit._key("k", [src], FLAGS, "generic") != k1, "headers not in the key"


def test_key_depends_on_compiler(tmp_path, monkeypatch):
    src = _source(tmp_path, "c", "int f(void) { return 1; }\n")
    k0 = _jit._key("c", [src], FLAGS, "generic")
    monkeypatch.setattr(_jit, "compiler", lambda: ("cc", "some other compiler 99.1"))
    assert _jit._key("c", [src], FLAGS, "generic") != k0


def test_build_load_and_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    src = _source(tmp_path, "reuse_t", "int answer(void) { return 42; }\n")
    lib = _jit.load("reuse_t", [src], FLAGS, "generic")
    assert lib.answer() == 42
    assert _jit.load("reuse_t", [src], FLAGS, "generic") is lib       # in-process memo
    key = _jit._key("reuse_t", [src], FLAGS, "generic")
    assert key in _jit.loaded_libraries()
    files = sorted(os.listdir(tmp_path / "cache"))
    assert f"{key}.so" in files
    assert [f for f in files if f.endswith(".so")] == [f"{key}.so"], files   # no temp files left
    # an edited source gets a fresh library next to the old one, never the stale binary
    src.write_text("int answer(void) { return 43; }\n")
    assert _jit.load("reuse_t", [src], FLAGS, "generic").answer() == 43
    assert len([f for f in os.listdir(tmp_path / "cache") if f.endswith(".so")]) == 2


def test_broken_source_raises_build_error(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(cache))
    src = _source(tmp_path, "broken_t", "int f(void) { return undeclared_thing + ; }\n")
    for _ in range(2):  # a failed build is not cached: it fails again, the same way
        with pytest.raises(_jit.BuildError) as info:
            _jit.load("broken_t", [src], FLAGS, "generic")
        msg = str(info.value)
        assert "broken_t" in msg and "error" in msg.lower(), msg
        assert "undeclared_thing" in msg, "the compiler's diagnostic is not in the message"
    assert not [f for f in os.listdir(cache) if f.endswith(".so")], "a broken build left a library behind"


_WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from tessera import _jit
    src, flags, me, other = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3], sys.argv[4]
    Path(me).touch()
    deadline = time.time() + 60
    while not os.path.exists(other) and time.time() < deadline:   # start both builds together
        time.sleep(0.005)
    lib = _jit.load("race_t", [src], flags, "generic")
    print(lib.answer())
""")


def test_concurrent_builds_produce_one_library(tmp_path):
    """Two processes race to build one library: both load it, one compile runs, one .so lands."""
    cache = tmp_path / "cache"
    src = _source(tmp_path, "race_t", _big_source())
    # a compiler wrapper that logs every compile (not the --version probes) to count the builds
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc-wrapper.sh"
    cc.write_text(f'#!/bin/sh\ncase "$1" in --version) ;; *) echo build >> "{log}" ;; esac\n'
                  f'exec "{_jit.compiler()[0]}" "$@"\n')
    cc.chmod(0o755)
    env = dict(os.environ, TESSERA_CACHE_DIR=str(cache), CC=str(cc))
    ready = [str(tmp_path / f"ready{i}") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(src), " ".join(FLAGS), ready[i], ready[1 - i]],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "42"
    libs = [f for f in os.listdir(cache) if f.endswith(".so")]
    assert len(libs) == 1, f"expected one library, found {libs}"
    assert log.read_text().split() == ["build"], "the library was compiled more than once"
    assert ctypes.CDLL(str(cache / libs[0])).answer() == 42


def test_real_kernel_library_builds_per_isa(tmp_path, monkeypatch):
    """cpu.library() names libraries by ISA, so levels never share a binary."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    src = _source(tmp_path, "isa_t", "int answer(void) { return 42; }\n")
    keys = set()
    for level in cpu.supported_isas():
        monkeypatch.setenv("TESSERA_CPU_ISA", level)
        assert cpu.library("isa_t", src).answer() == 42
        keys |= {k for k in _jit.loaded_libraries() if k.startswith(f"isa_t-{level}-")}
    assert len(keys) == len(cpu.supported_isas()), keys
