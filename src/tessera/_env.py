"""Environment variables read on every launch (``TESSERA_BACKEND``, ``TESSERA_CPU_ISA``,
``TRITON_INTERPRET``, ...): read at each call, so a change takes effect at once (tests and
users set them at run time), but cheaply.

Reads go through the public ``os.environ.get`` only: no private interpreter state (an earlier
version read CPython's private ``os.environ._data`` bytes dict; that is not an API and can
change under any Python release).  The price, measured on the 2-core VM (Python 3.11): ~0.8-1
us for a set variable, ~2-3 us for an unset one (``Mapping.get`` raises and catches a
KeyError); the three usually-unset reads of a cpu launch take ~7.8 us where the private read
took ~0.8 us, next to a tiny op's ~45-70 us per call on that machine.  There is no public
change signal to cache against, so any cache would break "a change takes effect at once";
this module stays the single place to revisit that trade-off.
"""
from __future__ import annotations

import os



def get(name: str, default: str = "") -> str:
    """``os.environ.get(name, default)``, read at each call (``os.environ`` looked up each time
    too, ~30 ns, so whatever mapping ``os.environ`` is at the time is the one read)."""
    return os.environ.get(name, default)
