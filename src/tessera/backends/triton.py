"""Triton backend: GPU kernels for NVIDIA (CUDA) and AMD (ROCm, also ``cuda`` in torch).

On a machine without a GPU the same kernels run on CPU tensors through
Triton's interpreter when ``TRITON_INTERPRET=1`` is set *before* triton is
imported.  The interpreter is slow (about 3 ms per program), so tests keep
shapes small and launchers pick large blocks.

Interpreter quirks handled by the kernels (triton 3.7.1): bf16 ``tl.dot``
multiplies raw bit patterns, so kernels upcast to fp32 before dots when
:func:`interpreted` is true; fp8 loads fail with ``other=``.
"""
from __future__ import annotations

import functools
import importlib.util

import torch

from .. import _env


def interpreted() -> bool:
    return _env.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def _importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def available(device: torch.device) -> tuple[bool, str]:
    if not _importable():
        return False, "triton is not installed (pip install 'tessera[triton]')"
    if device.type == "cuda":
        return True, ""
    if device.type == "cpu":
        if interpreted():
            return True, ""
        return False, ("the triton backend runs on CUDA/ROCm tensors; for CPU tensors set "
                       "TRITON_INTERPRET=1 before importing triton (interpreter, slow)")
    return False, f"the triton backend does not run on device {device}"


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def param(t: torch.Tensor | None) -> torch.Tensor | None:
    """A per-feature parameter (weight, bias, scales) as the kernels index it: ``ptr + col``.

    Kernels take only a row stride for activations; a parameter is read with unit stride from
    its first element, so a strided (``w[::2]``) or broadcast (stride 0, ``w.expand(n)``) one
    would be read wrong without any error.  Launchers pass every such tensor through here: a
    no-op when already contiguous, else an O(N) copy (dtype kept, so numerics do not change).
    """
    return t if t is None or t.is_contiguous() else t.contiguous()


def row_block(n: int) -> int:
    """Block size covering a whole row of ``n`` elements (kernels loop when a row is larger)."""
    return min(max(next_pow2(n), 16), 8192)


def describe() -> dict:
    info = {"installed": _importable(), "interpreter": interpreted(),
            "cuda_available": torch.cuda.is_available() if _importable() else False}
    if _importable():
        import triton  # noqa: F401  (only when asked: `tessera info`)
        info["version"] = triton.__version__
    return info
