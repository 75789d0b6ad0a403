"""Property-based fuzzing (hypothesis): random shapes, layouts and dtypes, cpu, opencl and triton
(under the interpreter) vs float64 reference.

Inputs are built generically from each op spec.  A small case tells the role of
every tensor argument:

* ``act``   -- shaped like the primary (first) input: gets the random shape;
* ``param`` -- 1-D of the primary's last-dim size (weight, bias);

and which arguments are optional (``None`` in some case) and which options
(strings, ``dim``) the cases use.  Hypothesis then draws 1-3 leading dims, a
last dim in 1..300, a dtype, the options, and an independent layout for every
``act`` tensor: contiguous, a column slice with a step (inner stride > 1), a
row slice of a wider buffer, a transpose, a broadcast (expand) or a nonzero
storage offset; every ``param`` gets one too: contiguous, step-sliced (``w[::2]``),
broadcast from one value (stride 0) or offset.  Each draw runs through the very same check as the matrix
(:func:`tessera.testing.matrix.run_case`: poisoned outputs, forward and
gradients under :mod:`tessera.testing.tolerance`).
fp32 draws may be arbitrarily ill-conditioned, so the fuzz also passes the fp32 eager
baseline (``fp32_eager=True``): an fp32 element passes under the defaults or under the
low-precision rule in fp32 (2x torch fp32's error, capped), see the tolerance docstring.

Bounded for CI: ``max_examples`` 25 per op (cpu, and opencl where a device is found), no
deadline, derandomized (set ``TESSERA_FUZZ_RANDOM=1`` for fresh draws, ``TESSERA_FUZZ_EXAMPLES``
for more); the Triton backend 8 per op on small shapes (``TESSERA_FUZZ_TRITON_EXAMPLES``).
"""
from __future__ import annotations

import os

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, supports
from tessera.testing.matrix import run_case

RANDOM = os.environ.get("TESSERA_FUZZ_RANDOM", "0") == "1"
EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25"))
MAX_NUMEL = 24_000
LAYOUTS = ("contig", "colstep", "rowslice", "transpose", "expand", "offset")
# Per-feature parameters (weight, bias) are 1-D: contiguous, step-sliced (w[::2]), broadcast
# from one value (stride 0) or at a storage offset.  Kernels that index them as ``ptr + col``
# fail the first two (issue #13 item 3).
PARAM_LAYOUTS = ("contig", "colstep", "expand", "offset")
# The Triton backend under the interpreter (~ms per program): a small bounded budget and
# small shapes; TESSERA_FUZZ_TRITON_EXAMPLES for more.
TRITON_EXAMPLES = int(os.environ.get("TESSERA_FUZZ_TRITON_EXAMPLES", "8"))
TRITON_MAX_NUMEL = 2_048


def analyse(spec):
    """-> (primary name, {name: role}, optional names, {option: [values]}) from the spec's cases."""
    roles: dict[str, str] = {}
    present: dict[str, int] = {}
    options: dict[str, list] = {}
    n_cases = 0
    primary = None
    for case in spec.cases:
        if case.tags & {"large", "extreme", "empty"}:
            continue
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
        if not tensors:
            continue
        n_cases += 1
        first = next(iter(tensors))
        primary = primary or first
        p = tensors[primary]
        for k, v in tensors.items():
            present[k] = present.get(k, 0) + 1
            if v.shape == p.shape:
                role = "act"
            elif v.dim() == 1 and v.shape[0] == p.shape[-1] and p.dim() > 1:
                role = "param"
            else:
                role = "unknown"
            if roles.get(k, role) != role and "unknown" not in (role, roles[k]):
                role = "unknown"
            roles.setdefault(k, role)
        for k, v in kw.items():
            if k not in tensors and k != "eps" and (isinstance(v, (str, bool, int)) or v is None):
                if v is None:
                    continue
                options.setdefault(k, [])
                if v not in options[k]:
                    options[k].append(v)
            elif k == "eps":
                options.setdefault("eps", [])
                if v not in options["eps"] and v > 0:
                    options["eps"].append(v)
    optional = {k for k in roles if present[k] < n_cases}
    return primary, roles, optional, options


def _build(shape, dtype, gen, layout, knobs):
    """A tensor of ``shape`` in ``layout``; ``knobs`` are hypothesis-drawn small integers."""
    def rnd(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)

    n = shape[-1]
    a, b = knobs
    if layout == "colstep":                     # inner stride a+2 (e.g. every other column)
        step = 2 + a % 2
        return rnd(*shape[:-1], n * step)[..., ::step]
    if layout == "rowslice":                    # rows of a wider buffer, starting at column b
        return rnd(*shape[:-1], n + 1 + a + b)[..., b:b + n]
    if layout == "transpose" and len(shape) >= 2:
        i = a % (len(shape) - 1)               # swap some leading dim with the last one
        s = list(shape)
        s[i], s[-1] = s[-1], s[i]
        return rnd(*s).transpose(i, -1)
    if layout == "expand" and len(shape) == 1:  # a parameter: one value broadcast (stride 0)
        return rnd(1).expand(*shape)
    if layout == "expand" and len(shape) >= 2:
        s = list(shape)
        for d in range(len(s) - 1):             # broadcast a subset of the leading dims (stride 0)
            if (a >> d) & 1 or d == 0:
                s[d] = 1
        return rnd(*s).expand(*shape)
    if layout == "offset":
        numel = 1
        for d in shape:
            numel *= d
        return rnd(numel + b + 1)[b + 1:].view(shape)
    return rnd(*shape)


@st.composite
def op_inputs(draw, spec, info, backend="cpu", max_numel=MAX_NUMEL):
    """A (dtype, Case) whose make() builds one random input set for ``backend``."""
    primary, roles, optional, options = info
    dtypes = [d for d in spec.dtypes if supports(spec, backend, torch.device("cpu"), d)[0]]
    dtype = draw(st.sampled_from(dtypes))
    lead = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    n = draw(st.integers(1, 300))
    while len(lead) > 1 and n * _prod(lead) > max_numel:
        lead = lead[1:]
    lead[0] = max(1, min(lead[0], max_numel // max(1, n * _prod(lead[1:]))))
    shape = (*lead, n)
    plan = {}
    for k, role in roles.items():
        if k in optional and not draw(st.booleans()):
            plan[k] = None
            continue
        if role == "act":
            plan[k] = (draw(st.sampled_from(LAYOUTS)), (draw(st.integers(0, 7)), draw(st.integers(0, 5))))
        else:
            plan[k] = ("contig", (0, 0))
    opts = {}
    for k, values in options.items():
        if k == "dim":
            opts[k] = draw(st.integers(-len(shape), len(shape) - 1))
        elif values:
            opts[k] = draw(st.sampled_from(values))
    for k, p in plan.items():  # parameters get their own layouts (drawn last)
        if p is not None and roles[k] != "act":
            knobs = (draw(st.integers(0, 7)), draw(st.integers(0, 5)))
            plan[k] = (draw(st.sampled_from(PARAM_LAYOUTS)), knobs)

    def make(dt, device, gen):
        kw = dict(opts)
        for k, p in plan.items():
            if p is None:
                kw[k] = None
            elif roles[k] == "act":
                kw[k] = _build(shape, dt, gen, p[0], p[1]).to(device)
            else:
                kw[k] = _build((n,), dt, gen, p[0], p[1]).to(device)
        return kw

    desc = f"shape={shape} dtype={dtype} opts={opts} plan={plan}"
    return dtype, Case(f"fuzz[{desc}]", make, frozenset())


def _prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def _ops():
    return [pytest.param(name, id=name) for name in sorted(tessera.OPS) if tessera.OPS[name].fuzz == "rows"]


@pytest.mark.parametrize("name", [n for n in sorted(tessera.OPS) if tessera.OPS[n].fuzz != "rows"])
def test_ops_outside_the_generic_fuzz_fuzz_themselves(name):
    """An op that opts out of the row-wise fuzz names a test file that runs hypothesis on it (its own
    @given, or tessera.testing.matrix.fuzz_spec with a strategy)."""
    path = Path(__file__).with_name(tessera.OPS[name].fuzz)
    assert path.is_file(), f"{name}: spec.fuzz names {path.name}, which does not exist"
    text = path.read_text()
    assert ("@given" in text or "fuzz_spec(" in text) and name in text, \
        f"{name}: {path.name} has no hypothesis test of this op"


@pytest.mark.fuzz  # `pytest -m fuzz`: EXAMPLES becomes >= 1000 (tests/conftest.py)
@pytest.mark.parametrize("name", _ops())
def test_fuzz_cpu_vs_reference(name):
    spec = tessera.OPS[name]
    info = analyse(spec)
    unknown = [k for k, r in info[1].items() if r == "unknown"]
    assert not unknown, (f"{name}: cannot infer the role of {unknown} from the cases; "
                         "teach tests/test_fuzz.py:analyse() about it")

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(drawn=op_inputs(spec, info))
    def check(drawn):
        dtype, case = drawn
        r = run_case(spec, "cpu", dtype, case, fp32_eager=True)
        assert r.ok, f"{case.name}: {r.why}"

    check()


@pytest.mark.fuzz  # `pytest -m fuzz`: EXAMPLES becomes >= 1000 (tests/conftest.py)
@pytest.mark.parametrize("name", _ops())
def test_fuzz_opencl_vs_reference(name):
    """The same generic fuzz on the opencl backend (PoCL here), same budget as cpu: random shapes,
    row strides, broadcasts and parameter layouts through the zero-copy buffers."""
    spec = tessera.OPS[name]
    if not any(supports(spec, "opencl", torch.device("cpu"), d)[0] for d in spec.dtypes):
        pytest.skip(f"{name}: no opencl kernel, or no OpenCL device here")
    info = analyse(spec)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(drawn=op_inputs(spec, info, "opencl"))
    def check(drawn):
        dtype, case = drawn
        r = run_case(spec, "opencl", dtype, case, fp32_eager=True)
        assert r.ok, f"{case.name}: {r.why}"

    check()


@pytest.mark.parametrize("name", _ops())
def test_fuzz_triton_vs_reference(name):
    """The same generic fuzz on the Triton backend (under TRITON_INTERPRET=1 on CPU tensors):
    a small bounded budget (TRITON_EXAMPLES) and small shapes (TRITON_MAX_NUMEL)."""
    spec = tessera.OPS[name]
    if not any(supports(spec, "triton", torch.device("cpu"), d)[0] for d in spec.dtypes):
        pytest.skip(f"{name}: the triton backend is not available here (TRITON_INTERPRET=1 not set?)")
    info = analyse(spec)

    @settings(max_examples=TRITON_EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(drawn=op_inputs(spec, info, "triton", TRITON_MAX_NUMEL))
    def check(drawn):
        dtype, case = drawn
        r = run_case(spec, "triton", dtype, case, fp32_eager=True)
        assert r.ok, f"{case.name}: {r.why}"

    check()
