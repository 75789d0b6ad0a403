"""Backends: ``reference`` (float64 torch), ``cpu`` (native C), ``triton`` (GPU; CPU via interpreter).

A backend's surface is tiny: ``available(device)`` and per-op kernel modules
that export ``DTYPES``, ``forward`` and ``backward``.  See ``tessera._registry``.
"""
