"""Environment variables read on every launch (``TESSERA_BACKEND``, ``TESSERA_CPU_ISA``,
``TRITON_INTERPRET``, ...): read at each call, so a change takes effect at once (tests and
users set them at run time), but cheaply.

Reads go through the public ``os.environ.get`` only: no private interpreter state (an earlier
version read CPython's private ``os.environ._data`` bytes dict; that is not an API and can
change under any Python release).  The price, measured on the 2-core VM (Python 3.11): ~0.8-1
us for a set variable, ~2-3 us for an unset one (``Mapping.get`` raises and catches a
KeyError); the three usually-unset reads of a cpu launch take ~7.8 us where the private read
took ~0.8 us, next to a tiny op's ~45-70 us per call on that machine.  There is no public
change signal to cache against, so any cache would break "a change takes effect at once".
Since the per-call overhead work (issue #16) the reads go to C ``getenv`` through the cpu
backend's ``_fastcall`` extension once it is loaded (see :func:`get`): public, uncached,
~0.05 us.  This module stays the single place to revisit that trade-off.
"""
from __future__ import annotations

import os



_PROCESS_ENVIRON = os.environ  # the mapping whose every write goes through putenv/unsetenv
_C_GETENV: list = []  # [getenv] of the _fastcall extension once the cpu backend has loaded it


def get(name: str, default: str = "") -> str:
    """``os.environ.get(name, default)``, read at each call.

    Once the cpu backend has loaded its ``_fastcall`` extension, the read is C ``getenv`` on
    the process environment, which ``os.environ`` writes through (``putenv``/``unsetenv`` on
    every set and delete, so ``monkeypatch.setenv``/``delenv`` and ``mock.patch.dict`` are
    seen at once): ~0.05 us set or unset, where the Mapping's ``get`` of an unset variable
    raises and catches a KeyError (~0.8 us here; three such reads were most of a tiny launch's
    backend lookup).  Before that, without the extension, or while ``os.environ`` is some other
    mapping than the process's own (a test's stand-in), it is ``os.environ.get``, looked up each
    time (~30 ns), so whatever mapping ``os.environ`` is at the time is the one read."""
    env = os.environ
    if env is _PROCESS_ENVIRON and _C_GETENV:  # (a stand-in mapping is read through its own get)
        return _C_GETENV[0](name, default)
    return env.get(name, default)
