"""Reference backend: the float64 references in plain torch, always available.

Kernel modules of this backend (``ops/<op>/ref.py``) upcast inputs to float64,
run the reference, and cast outputs back to the input dtype, so the backend
obeys the same op contract as the fast ones.  Backward kernels are the
closed-form float64 gradients written out in each ``ref.py`` (autograd is not
available inside a custom op's kernel); the test matrix checks them against
float64 autograd through the forward reference.
"""
from __future__ import annotations

import torch


def up(t):
    return None if t is None else t.to(torch.float64)
