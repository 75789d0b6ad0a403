"""``tessera._env.get``: environment reads through the public ``os.environ`` mapping, at each call."""
from __future__ import annotations

import collections.abc
import os

from tessera import _env, _registry


class _Mapping(collections.abc.MutableMapping):
    """An ``os.environ`` stand-in with no private ``_data``: only the public mapping API
    (mutable, since pytest writes PYTEST_CURRENT_TEST between phases)."""

    def __init__(self, d):
        self._d = dict(d)

    def __getitem__(self, k):
        return self._d[k]

    def __setitem__(self, k, v):
        self._d[k] = v

    def __delitem__(self, k):
        del self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


def test_env_reads_the_public_mapping(monkeypatch):
    """Whatever ``os.environ`` is, its public ``get`` decides (a read of CPython's private
    ``os.environ._data`` captured at import would still see the real process environment)."""
    monkeypatch.delenv("TESSERA_BACKEND", raising=False)
    monkeypatch.setattr(os, "environ", _Mapping({"TESSERA_BACKEND": "reference"}))
    assert _env.get("TESSERA_BACKEND") == "reference"
    assert _env.get("TESSERA_NOT_SET", "dflt") == "dflt"
    assert _registry.requested_backend(None) == "reference"  # the launch path reads it the same way


def test_env_change_takes_effect_at_once(monkeypatch):
    monkeypatch.setenv("TESSERA_CPU_ISA", "generic")
    assert _env.get("TESSERA_CPU_ISA") == "generic"
    monkeypatch.setenv("TESSERA_CPU_ISA", "avx2")
    assert _env.get("TESSERA_CPU_ISA") == "avx2"
    monkeypatch.delenv("TESSERA_CPU_ISA")
    assert _env.get("TESSERA_CPU_ISA", "none") == "none"
