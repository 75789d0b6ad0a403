"""Property-based fuzzing of tessera.attention: cpu vs the float64 reference on random
shapes, head counts, lengths (varlen with empty sequences), masks, softcap and layouts drawn by
``spec.random_case(seed)`` (the generic row fuzz of test_fuzz.py cannot build attention inputs)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera.ops.attention.spec import random_case
from tessera.testing.matrix import run_case

EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_fuzz_attention_cpu_vs_reference(dtype):
    spec = tessera.OPS["attention"]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("TESSERA_FUZZ_RANDOM") != "1",
              database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(0, 2**31 - 1))
    def check(seed):
        case = random_case(seed)
        r = run_case(spec, "cpu", dtype, case)
        assert r.ok, f"{case.name}: {r.why}"

    check()
