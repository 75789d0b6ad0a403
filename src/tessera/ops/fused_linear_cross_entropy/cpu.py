"""Fused linear cross-entropy on the cpu backend: the chunk loop of chunks.py around
the native CPU cross-entropy kernel (ops/cross_entropy/cpu.py)."""
from __future__ import annotations

from ..cross_entropy import cpu as _ce
from . import chunks

DTYPES = _ce.DTYPES


def forward(*args):
    return chunks.forward(_ce, *args)


def backward(*args):
    return chunks.backward(_ce, *args)
