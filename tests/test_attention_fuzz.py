"""Property-based fuzzing of tessera.attention: cpu and opencl vs the float64 reference on random
shapes, head counts, lengths (varlen with empty sequences), masks, softcap and layouts drawn by
``spec.random_case(seed)`` (the generic row fuzz of test_fuzz.py cannot build attention inputs)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera._registry import backend_available
from tessera.ops.attention.spec import random_case
from tessera.testing.matrix import run_case

EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25"))


NATIVE = [b for b in ("cpu", "opencl") if backend_available(b, torch.device("cpu"))[0]]


@pytest.mark.fuzz  # `pytest -m fuzz`: EXAMPLES becomes >= 1000 (tests/conftest.py)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", NATIVE)
def test_fuzz_attention_vs_reference(backend, dtype):
    spec = tessera.OPS["attention"]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("TESSERA_FUZZ_RANDOM") != "1",
              database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(0, 2**31 - 1))
    def check(seed):
        case = random_case(seed)
        r = run_case(spec, backend, dtype, case)
        assert r.ok, f"{case.name}: {r.why}"

    check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_forward_block_rows_do_not_change_outputs(dtype, monkeypatch):
    """The cpu forward's query rows per work item (FWD_BLOCK_M, read at call time) only group
    rows: every row's arithmetic is the same, so outputs and lse are bit-identical for any
    multiple of 16, on random cases (varlen, windows, softcap, GQA) from the fuzz generator."""
    from tessera.ops.attention import cpu as acpu
    for seed in range(6):
        kw = random_case(seed).make(dtype, torch.device("cpu"), torch.Generator().manual_seed(seed))
        outs = []
        for bm in (16, 64, 128, 192):
            monkeypatch.setattr(acpu, "FWD_BLOCK_M", bm)
            outs.append(tessera.attention(**{**kw, "return_lse": True}, backend="cpu"))
        for o, lse in outs[1:]:
            assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1]), f"seed {seed}"


@pytest.mark.skipif("opencl" not in NATIVE, reason="no OpenCL device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opencl_local_size_does_not_change_outputs(dtype, monkeypatch):
    """The opencl forward's work-group size only groups query rows (one per work-item; tiles are
    aligned to the key index, not to the group): outputs and lse are bit-identical for any local
    size, odd ones included, on random cases (varlen, windows, softcap, GQA)."""
    from tessera.ops.attention import opencl as aocl
    for seed in range(4):
        kw = random_case(seed).make(dtype, torch.device("cpu"), torch.Generator().manual_seed(seed))
        outs = []
        for L in (1, 7, 32, 64):
            monkeypatch.setattr(aocl, "LOCAL_SIZE", L)
            outs.append(tessera.attention(**{**kw, "return_lse": True}, backend="opencl"))
        for o, lse in outs[1:]:
            assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1]), f"seed {seed}"
