"""Test setup: the Triton backend runs under the interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is imported anywhere; tessera
imports triton lazily, so setting it here (before any test module imports an
op's triton kernels) is enough.  Set TESSERA_TEST_TRITON=0 to skip Triton.
"""
import os

if os.environ.get("TESSERA_TEST_TRITON", "1") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TESSERA_SEED", "0")
# The interpreter runs tl.dot through numpy's BLAS; its worker threads thrash when two pytest
# workers share two cores (measured: ~40% of the interpreted attention kernels' CPU time).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402

torch.manual_seed(0)
