"""Every tensor argument of every op, in any layout: a kernel indexing a parameter as contiguous
(``w_ptr + col``) reads the wrong elements of ``w[::2]`` or ``w.expand(n)`` without any error.

* ``test_strided_arguments_give_identical_results``: generic over the registered ops and every
  native backend that runs here (cpu; opencl; triton under the interpreter): each tensor argument
  of a few of the op's cases, replaced by a step-2 view holding the same values (the other half
  of the buffer is zeros), gives bit-identical outputs -- or a ValueError naming that argument
  (ops that require contiguous paged caches say so).
* ``test_norms_strided_and_broadcast_parameters``: rms_norm / layer_norm with ``w[::2]`` and a
  stride-0 ``expand`` weight/bias against the float64 reference, forward and gradients (the
  bug of issue #13 item 3 on the Triton backend).
"""
from __future__ import annotations

import pytest
import torch

import tessera
from tessera._registry import Case, native_backends, supports
from tessera.testing.matrix import run_case

BACKENDS = native_backends()  # cpu; opencl where a device is found; triton under the interpreter
CASES_PER_OP = 2


def _step2(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` in every other element of a zero buffer (inner stride 2)."""
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    buf[..., ::2] = t
    return buf[..., ::2]


def _equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return all(_equal(a[k], b[k]) for k in a)
    if not isinstance(a, torch.Tensor):
        return a == b
    if a.is_floating_point():  # NaN where the contiguous call had NaN (zero-nan-inf cases)
        return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and \
            torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    return torch.equal(a, b)


def _params():
    out = []
    for name in sorted(tessera.OPS):
        for backend in [b for b in BACKENDS if b in tessera.OPS[name].kernels]:
            out.append(pytest.param(name, backend, id=f"{name}-{backend}"))
    return out


@pytest.mark.parametrize("name,backend", _params())
def test_strided_arguments_give_identical_results(name, backend):
    spec = tessera.OPS[name]
    dev = torch.device("cpu")
    dtypes = [d for d in spec.dtypes if supports(spec, backend, dev, d)[0]]
    if not dtypes:
        pytest.skip(f"{name} has no {backend} kernel here")
    cases = [c for c in spec.cases if not c.tags & {"large", "empty"}][:CASES_PER_OP]
    checked = 0
    for case in cases:
        kw = case.make(dtypes[0], dev, torch.Generator().manual_seed(0))

        def call(args):  # ops writing in place get fresh copies of what they mutate
            args = {k: v.clone() if k in spec.mutates and v is not None else v for k, v in args.items()}
            return spec.fn(**args, backend=backend), [args[k] for k in spec.mutates]

        base = call(kw)
        for k, v in kw.items():
            if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.numel() <= 1:
                continue
            try:
                got = call({**kw, k: _step2(v)})
            except ValueError as e:  # an explicit layout requirement is fine, if it names the argument
                assert f"'{k}'" in str(e), f"{name}/{case.name}: error does not name '{k}': {e}"
                continue
            assert _equal(base, got), (f"{name} ({backend}, {case.name}): argument '{k}' as a step-2 view "
                                       f"gives different results than the same values contiguous")
            checked += 1
    assert checked, f"{name}: no argument was checked"


def _norm_case(op, layout):
    def mk(dtype, device, gen):
        N = 37

        def rnd(*s):
            return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype).to(device)

        def par():
            if layout == "step2":   # w[::2] of a wider buffer
                return rnd(2 * N)[::2]
            if layout == "expand":  # one value broadcast to N (stride 0)
                return rnd(1).expand(N)
            return rnd(3 * N + 5)[5:5 + 3 * N:3]  # offset + step 3
        kw = {"x": rnd(5, N), "weight": par(), "eps": 1e-5}
        if op == "layer_norm":
            kw["bias"] = par()
        return kw
    return Case(f"{op}-{layout}-params", mk, frozenset())


@pytest.mark.parametrize("backend", ("reference",) + BACKENDS)
@pytest.mark.parametrize("layout", ["step2", "expand", "offset-step3"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_norms_strided_and_broadcast_parameters(op, layout, backend):
    spec = tessera.OPS[op]
    for dtype in (torch.float32, torch.float16):
        if not supports(spec, backend, torch.device("cpu"), dtype)[0]:
            pytest.skip(f"{op} has no {backend} kernel here")
        r = run_case(spec, backend, dtype, _norm_case(op, layout))
        assert r.ok, f"{op} {backend} {dtype} {layout}: {r.why}"
