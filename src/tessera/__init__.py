"""tessera: fused AI operators with one op contract across backends.

``import tessera`` registers the ``tessera::`` custom ops and nothing else: no
device is initialised, triton is not imported and no native code is compiled
until an op first runs on a backend that needs it.
"""
from __future__ import annotations

from ._registry import BACKENDS, OPS, BackendError, use_backend
from .ops.rms_norm import rms_norm

__version__ = "0.1.0"

__all__ = ["BACKENDS", "OPS", "BackendError", "use_backend", "rms_norm"]
