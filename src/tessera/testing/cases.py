"""The case builders, for tests: re-exported from :mod:`tessera._cases`.

They live in the library (the op specs build their ``cases`` at import time, and the library
must not import its test helpers); this name stays so tests and user code keep working.
"""
from __future__ import annotations

from .._cases import LAYOUTS, frozen, make, row_shapes, seed_for, standard_cases

__all__ = ["LAYOUTS", "frozen", "make", "row_shapes", "seed_for", "standard_cases"]
