"""The correctness matrix: every (op, backend, dtype, case), forward and gradients.

Used by ``tests/test_matrix.py`` and ``tessera check``.  Each run:

1. builds the case's inputs (random, in the case's layout);
2. runs the op on the backend with every kernel-written buffer poisoned (NaN; forward
   outputs and, in step 4, gradients) so unwritten elements fail;
3. compares every output with the float64 reference and the plain-PyTorch
   same-dtype baseline under :mod:`tessera.testing.tolerance`;
4. unless the case is tagged ``nograd``, back-propagates the same random upstream
   gradients through the op, the float64 reference and the baseline, and compares
   the input gradients the same way.
"""
from __future__ import annotations

import dataclasses

import torch

from .._library import poison_outputs
from .._registry import OPS, BACKENDS, Case, OpSpec, backend_available, has_backward, supports
from . import tolerance
from .cases import seed_for


@dataclasses.dataclass
class Result:
    op: str
    backend: str
    dtype: torch.dtype
    case: str
    ok: bool
    fwd_err: float = 0.0
    grad_err: float = 0.0
    why: str = ""


def _host(v):
    """A tensor on another device, detached and copied to the CPU (others unchanged)."""
    return v.detach().cpu() if isinstance(v, torch.Tensor) and v.device.type != "cpu" else v


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _inputs(kw: dict, names, dtype=None, copy=False, place=None) -> tuple[dict, list[str]]:
    """Detached copies of the case inputs; the ``names`` among them become autograd leaves.

    The kernel's inputs (``dtype=None, copy=False``) keep their layout: views of a
    wider buffer or broadcast rows are leaves themselves, exactly as passed in.  ``place``
    (tensor -> tensor of the same layout) moves each into other memory (testing.fence).
    """
    out, leaves = {}, []
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            v = v.detach()
            if dtype is not None and v.is_floating_point() and v.element_size() > 1:
                v = v.to(dtype)  # integer and fp8 inputs (indices, quantized caches) keep their dtype
            elif copy:
                v = v.clone()
            if place is not None:
                v = place(v)
            if k in names and v.is_floating_point():
                v.requires_grad_(True)
                leaves.append(k)
        out[k] = v
    return out, leaves


def run_case(spec: OpSpec, backend: str, dtype: torch.dtype, case: Case, device="cpu",
             grads: bool = True, place=None, fp32_eager: bool = False) -> Result:
    """One cell.  ``fp32_eager`` (the hypothesis fuzz only) also runs the eager baseline in fp32 and
    lets fp32 outputs pass under the low-precision rule beside the defaults (tolerance docstring)."""
    gen = torch.Generator().manual_seed(seed_for(f"{spec.name}/{case.name}/{dtype}"))
    kw = case.make(dtype, torch.device(device), gen)
    # a backend whose kernel module is forward-only (BACKWARD = False) is checked forward here;
    # tests/test_errors.py checks that its gradient raises BackendError
    do_grad = grads and "nograd" not in case.tags and has_backward(spec, backend)
    names = spec.grad_inputs if do_grad else ()
    k_kw, leaves = _inputs(kw, names, place=place)               # kernel inputs keep their layout
    # the float64 reference always runs on the CPU: CUDA's elementwise kernels contract a*b+c into
    # FMAs, which would move the reference's emulated fp32 roundings (the integer contract's scales)
    r_kw, _ = _inputs({k: _host(v) for k, v in kw.items()}, names, torch.float64)
    lp_kw = _inputs(kw, names, copy=True)[0] if dtype != torch.float32 or fp32_eager else {}
    res = Result(spec.name, backend, dtype, case.name, True)
    try:
        with poison_outputs():
            outs = _as_tuple(spec.fn(**k_kw, backend=backend))
        refs = _as_tuple(spec.ref(**r_kw))
        lps = _as_tuple(spec.eager(**lp_kw)) if lp_kw else (None,) * len(refs)
        for i, (o, r, lp) in enumerate(zip(outs, refs, lps)):
            odt = spec.out_dtypes.get(i, dtype)
            v = tolerance.compare(_host(o), r, _host(lp) if odt == dtype else None, odt, spec.fp32_tol.get(i))
            res.fwd_err = max(res.fwd_err, v.err)
            if not v.ok:
                return dataclasses.replace(res, ok=False, why=f"output {i}: {v.why}")
        if not leaves:
            return res
        # upstream gradients for every differentiable output, each in its output's dtype
        diff = [i for i, o in enumerate(outs) if o.requires_grad]
        ups = {i: torch.randn(outs[i].shape, generator=gen, dtype=torch.float64) for i in diff}
        keep = place or (lambda t: t)
        with poison_outputs():  # gradient buffers too: an element backward never writes stays NaN
            g_k = torch.autograd.grad([outs[i] for i in diff], [k_kw[n] for n in leaves],
                                      [keep(ups[i].to(outs[i].device, outs[i].dtype)) for i in diff], allow_unused=True)
        g_r = torch.autograd.grad([refs[i] for i in diff], [r_kw[n] for n in leaves],
                                  [ups[i] for i in diff], allow_unused=True)
        g_lp = (torch.autograd.grad([lps[i] for i in diff], [lp_kw[n] for n in leaves],
                                    [ups[i].to(outs[i].device, outs[i].dtype).to(lps[i].dtype) for i in diff], allow_unused=True)
                if lp_kw else (None,) * len(leaves))
        for n, gk, gr, gl in zip(leaves, g_k, g_r, g_lp):
            if gr is None:
                gr = torch.zeros(kw[n].shape, dtype=torch.float64)
            if gk is None:
                return dataclasses.replace(res, ok=False, why=f"no gradient for '{n}'")
            v = tolerance.compare(_host(gk), gr, _host(gl), dtype, spec.fp32_grad_tol.get(n))
            res.grad_err = max(res.grad_err, v.err)
            if not v.ok:
                return dataclasses.replace(res, ok=False, why=f"grad '{n}': {v.why}")
    except Exception as e:  # reported as a failed cell, the test re-raises
        return dataclasses.replace(res, ok=False, why=f"{type(e).__name__}: {e}")
    return res


def fuzz_spec(op: str, backend: str, inputs, default_examples: int = 25) -> None:
    """Hypothesis over the (dtype, Case) pairs the strategy ``inputs`` draws, each run through
    :func:`run_case` on ``backend`` against the op's reference: the body of the ops' own fuzz
    tests (``spec.fuzz``), which mark themselves ``fuzz``.  The budget is TESSERA_FUZZ_EXAMPLES
    (``pytest -m fuzz`` sets 1000; tests/test_fuzz_budget.py), derandomized, no example database."""
    import os

    from hypothesis import HealthCheck, given, settings

    spec = OPS[op]

    @settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", str(default_examples))), deadline=None,
              derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(drawn=inputs)
    def check(drawn):
        dtype, case = drawn
        r = run_case(spec, backend, dtype, case)
        assert r.ok, f"{op} {backend} {case.name} {dtype}: {r.why}"

    check()


def cells(backends=BACKENDS, ops=None, device="cpu", include_large=True):
    """Yield every runnable (spec, backend, dtype, case) on this machine."""
    dev = torch.device(device)
    for name, spec in sorted(OPS.items()):
        if ops and name not in ops:
            continue
        for b in backends:
            if not backend_available(b, dev)[0]:
                continue
            for dtype in spec.dtypes:
                if not supports(spec, b, dev, dtype)[0]:
                    continue
                for case in spec.cases:
                    if "large" in case.tags and not include_large:
                        continue
                    yield spec, b, dtype, case
