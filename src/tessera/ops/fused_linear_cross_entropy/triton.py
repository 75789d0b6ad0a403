"""Fused linear cross-entropy on the triton backend: the chunk loop of chunks.py around
the Triton cross-entropy kernel (ops/cross_entropy/triton.py; GPU, or CPU tensors under TRITON_INTERPRET=1)."""
from __future__ import annotations

from ..cross_entropy import triton as _ce
from . import chunks

DTYPES = _ce.DTYPES


def forward(*args):
    return chunks.forward(_ce, *args)


def backward(*args):
    return chunks.backward(_ce, *args)
