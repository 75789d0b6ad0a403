"""tessera.quant: quantised formats, their integer contract and the model API.

``contract`` holds the rules every backend reproduces bit for bit (see its docstring).
"""
from __future__ import annotations

from . import contract  # noqa: F401
