"""Environment variables read on every launch (``TESSERA_BACKEND``, ``TESSERA_CPU_ISA``,
``TRITON_INTERPRET``, ...): read at each call, so a change takes effect at once (tests and
users set them at run time), but cheaply.

``os.environ.get`` costs ~1.1 us (it encodes the key and decodes the value on every call) and
a launch read three of them, ~15% of a tiny op's per-call cost.  On POSIX CPython
``os.environ`` keeps its items in a bytes dict (``_data``) that every ``os.environ[...] =``,
``del`` and ``monkeypatch.setenv`` updates; reading it directly costs ~0.03 us.  Anywhere else
this falls back to ``os.environ.get``.
"""
from __future__ import annotations

import os

_DATA = getattr(os.environ, "_data", None)
_RAW = os.name == "posix" and isinstance(_DATA, dict)
_KEYS: dict[str, bytes] = {}


def get(name: str, default: str = "") -> str:
    """``os.environ.get(name, default)``."""
    if not _RAW:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = os.fsencode(name)
    v = _DATA.get(key)
    return default if v is None else os.fsdecode(v)
