"""Build-on-first-use cache for native (C) kernels.

A module is one shared library built from framework-free C sources with the
system compiler.  The cache key hashes the sources (and every header in
``tessera/csrc`` and beside the sources), the flags, the compiler's version line and the CPU ISA the
build targets, so editing a kernel, changing flags or moving the cache to a
different machine never loads a stale binary.  Builds are guarded by an
exclusive ``fcntl`` lock per key and land via an atomic rename, so concurrent
processes (pytest-xdist workers, several notebooks) build once and never load a
half-written file.

Cache location: ``$TESSERA_CACHE_DIR`` or ``~/.cache/tessera/jit``.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    d = os.environ.get("TESSERA_CACHE_DIR") or os.path.join(Path.home(), ".cache", "tessera", "jit")
    return Path(d)


@functools.lru_cache(maxsize=None)
def compiler() -> tuple[str, str] | None:
    """(path, version line) of the C compiler, or None when there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return cc, out.stdout.splitlines()[0] if out.stdout else cc


def _key(name: str, sources: list[Path], flags: list[str], isa: str) -> str:
    h = hashlib.sha256()
    # every header a source can include: csrc/ and the sources' own folders (an op's
    # private headers, e.g. ops/attention/*.h), so editing any of them rebuilds
    local = sorted({h for src in sources for h in Path(src).parent.glob("*.h")})
    for p in sorted(CSRC.glob("*.h")) + local + list(sources):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(compiler()[1].encode())
    h.update(isa.encode())
    return f"{name}-{isa}-{h.hexdigest()[:16]}"


def load(name: str, sources: list[Path], flags: list[str], isa: str) -> ctypes.CDLL:
    """Return the loaded library, building it into the cache first if needed."""
    if compiler() is None:
        raise BuildError("no C compiler found (set CC or install gcc)")
    key = _key(name, sources, flags, isa)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        lib = ctypes.CDLL(str(_built(name, sources, flags, isa)))
        _loaded[key] = lib
        return lib


def built(name: str, sources: list[Path], flags: list[str], isa: str) -> Path:
    """The path of the cached shared object, building it first if needed (for a library that is
    loaded some other way than ctypes: the Python extension of ``_fastcall.py``)."""
    with _lock:
        return _built(name, sources, flags, isa)


def _built(name: str, sources: list[Path], flags: list[str], isa: str) -> Path:
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set CC or install gcc)")
    key = _key(name, sources, flags, isa)
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{key}.so"
    if not target.exists():
        with open(root / f"{key}.lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            try:
                if not target.exists():
                    _build(cc[0], sources, flags, target)
            finally:
                fcntl.flock(lockf, fcntl.LOCK_UN)
    return target


def _build(cc: str, sources: list[Path], flags: list[str], target: Path) -> None:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cc, *flags, "-I", str(CSRC), *map(str, sources), "-o", tmp]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise BuildError(f"building {target.name} failed:\n{' '.join(cmd)}\n{out.stderr[-4000:]}")
        os.replace(tmp, target)  # atomic: readers never see a partial library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def loaded_libraries() -> list[str]:
    """Names of native libraries loaded in this process (used by the lean-import test)."""
    return sorted(_loaded)
