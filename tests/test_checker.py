"""The checker checks: planted kernel bugs must make ``run_case`` fail (a test that cannot fail is a defect).

For every op, its cpu kernel module's ``forward``/``backward`` is monkeypatched to
plant one bug at a time, and the matrix's ``run_case`` must report the cell as
failed:

(a) one output element left unwritten (the NaN poison must be seen);
(b) one element off by a few ulps beyond the fp32 tolerance, and in bf16 by 4x
    the error of plain PyTorch in bf16 (the FlashAttention-style 2x rule);
(c) a wrong gradient (every gradient the backward kernel returns, in turn);
(d) an output of the wrong dtype;
(e) an all-zero output on every ``extreme`` case in fp16/bf16 (values near 65504, +-1e4
    logits, inf/NaN tails), where a plain-PyTorch baseline is most likely to break;
(f) a w8a8 / fp8 linear that skips the per-token activation quantization (fp16).

Each planted run is paired with the unpatched control on the same case, which
must pass.  The tolerance helper's own edge rules are unit-tested at the end.

(a) and (c) and the unwritten gradient element (the poison must reach every buffer a backend's
launcher allocates, forward and backward) run on every native backend that runs here with a
kernel for the op (cpu, opencl; not the Triton interpreter, too slow for every planted bug);
the tolerance probes (b), (d), (e), (f) judge an output whatever computed it and run on cpu.
"""
from __future__ import annotations

import importlib

import pytest
import torch

import tessera
from tessera._library import new_output
from tessera._registry import has_backward, kernel_module, native_backends
from tessera.testing import tolerance
from tessera.testing.cases import seed_for
from tessera.testing.matrix import run_case

SKIP_TAGS = {"large", "extreme", "empty", "nograd", "layout"}


def _richest_case(spec):
    best = None
    for case in spec.cases:
        if case.tags & SKIP_TAGS:
            continue
        kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        t = [v for v in kw.values() if isinstance(v, torch.Tensor)]
        if not t or min(v.numel() for v in t) < 8:
            continue
        key = (-len(t), sum(v.numel() for v in t))
        if best is None or key < best[0]:
            best = (key, case)
    assert best is not None
    return best[1]


def _params():
    return [pytest.param(spec, _richest_case(spec), id=name) for name, spec in sorted(tessera.OPS.items())
            if "cpu" in spec.kernels and not spec.mutates]


PLANT_BACKENDS = [b for b in native_backends() if b != "triton"]


def _backend_params():
    """(spec, case, backend) for every op and planted-bug backend with a kernel for it."""
    return [pytest.param(spec, _richest_case(spec), b, id=f"{name}-{b}") for name, spec in sorted(tessera.OPS.items())
            if not spec.mutates for b in PLANT_BACKENDS if b in spec.kernels]


def _cpu_module(spec):
    return importlib.import_module(spec.kernels["cpu"])


def _map_first(out, fn):
    """Apply ``fn`` to the first tensor of a kernel's return value (a tensor or a tuple)."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    out = list(out)
    out[0] = fn(out[0])
    return tuple(out)


def _map_index(out, i, fn):
    if isinstance(out, torch.Tensor):
        assert i == 0
        return fn(out)
    out = list(out)
    out[i] = fn(out[i])
    return tuple(out)


def _tensor_indices(out):
    if isinstance(out, torch.Tensor):
        return [0]
    return [i for i, t in enumerate(out) if isinstance(t, torch.Tensor) and t.numel() > 0]


def _control(spec, dtype, case, backend="cpu"):
    r = run_case(spec, backend, dtype, case)
    assert r.ok, f"control run fails before any bug is planted: {r.why}"


def _supports(spec, backend, dtype):
    if dtype not in kernel_module(spec, backend).DTYPES:
        pytest.skip(f"{spec.name}: {backend} has no {dtype} kernel")


@pytest.mark.parametrize("spec,case,backend", _backend_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unwritten_element_is_caught(spec, case, backend, dtype, monkeypatch):
    _supports(spec, backend, dtype)
    _control(spec, dtype, case, backend)
    mod = kernel_module(spec, backend)
    orig = mod.forward

    def forward(*a, **k):
        def drop_last(y):
            fresh = new_output(y.shape, y.dtype, y.device)   # poisoned by run_case
            fresh.view(-1)[:-1] = y.reshape(-1)[:-1]
            return fresh
        return _map_first(orig(*a, **k), drop_last)

    monkeypatch.setattr(mod, "forward", forward)
    r = run_case(spec, backend, dtype, case, grads=False)
    assert not r.ok, "an unwritten (NaN-poisoned) output element went unnoticed"
    # float outputs see the NaN poison; exact (integer) outputs see an element that differs
    assert any(s in r.why for s in ("non-finite", "NaN", "differ from the reference", "bit-exact")), r.why


def _ulp(v: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(v.abs(), torch.tensor(float("inf"), dtype=v.dtype)) - v.abs()


@pytest.mark.parametrize("spec,case", _params())
def test_fp32_error_beyond_tolerance_is_caught(spec, case, monkeypatch):
    _control(spec, torch.float32, case)
    mod = _cpu_module(spec)
    orig = mod.forward
    rtol, atol = spec.fp32_tol.get(0, (tolerance.FP32_RTOL, tolerance.FP32_ATOL))

    def forward(*a, **k):
        def bump(y):
            y = y.clone()
            flat = y.view(-1)
            j = int(flat.abs().argmax())
            v = flat[j]
            # the tolerance at this element, plus 16 ulps (far above the kernel's own error)
            flat[j] = v + (atol + rtol * v.abs()) + 16 * _ulp(v)
            return y
        return _map_first(orig(*a, **k), bump)

    monkeypatch.setattr(mod, "forward", forward)
    r = run_case(spec, "cpu", torch.float32, case, grads=False)
    assert not r.ok, "an fp32 error just beyond the tolerance went unnoticed"


def _eager_error(spec, case, dtype):
    """max|eager_lp - ref64| of output 0 on the very inputs run_case will build."""
    gen = torch.Generator().manual_seed(seed_for(f"{spec.name}/{case.name}/{dtype}"))
    kw = case.make(dtype, torch.device("cpu"), gen)
    # as the matrix does: integer and fp8 inputs (codes, indices) keep their dtype
    ref = spec.ref(**{k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.element_size() > 1
                          else v) for k, v in kw.items()})
    lp = spec.eager(**kw)
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
    lp = lp[0] if isinstance(lp, (tuple, list)) else lp
    return float((lp.double() - ref).abs().max())


@pytest.mark.parametrize("spec,case", _params())
def test_bf16_error_of_4x_eager_is_caught(spec, case, monkeypatch):
    out0 = spec.ref(**case.make(torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(0)))
    out0 = out0[0] if isinstance(out0, (tuple, list)) else out0
    if tolerance.exact_dtype(out0.dtype):
        pytest.skip(f"{spec.name}: output 0 is an integer/fp8 format, bit-exact (no bf16 tolerance to probe)")
    _control(spec, torch.bfloat16, case)
    lp_err = _eager_error(spec, case, torch.bfloat16)
    assert lp_err > 0
    mod = _cpu_module(spec)
    orig = mod.forward

    def forward(*a, **k):
        def bump(y):
            y = y.clone()
            flat = y.view(-1)
            # the smallest-magnitude element: the bf16 rounding of v + delta barely blurs delta there
            j = int(flat.float().abs().argmin())
            flat[j] = (flat[j].float() + 4 * lp_err).to(y.dtype)
            return y
        return _map_first(orig(*a, **k), bump)

    monkeypatch.setattr(mod, "forward", forward)
    r = run_case(spec, "cpu", torch.bfloat16, case, grads=False)
    assert not r.ok, f"a bf16 error of 4x the eager error ({4 * lp_err:.3g}) went unnoticed"


def _backward_outputs(spec, dtype, case, monkeypatch, backend="cpu"):
    """(the backend's kernel module, its unpatched backward, indices of the tensors that backward
    returns), from one probing run of the unplanted cell (which must pass)."""
    mod = kernel_module(spec, backend)
    orig = mod.backward
    seen = []

    def probe(*a, **k):
        out = orig(*a, **k)
        seen.append(_tensor_indices(out))
        return out

    monkeypatch.setattr(mod, "backward", probe)
    assert run_case(spec, backend, dtype, case).ok
    assert seen, "the backward kernel was never called"
    return mod, orig, seen[0]


@pytest.mark.parametrize("spec,case,backend", _backend_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wrong_gradient_is_caught(spec, case, backend, dtype, monkeypatch):
    if not spec.grad_inputs or not has_backward(spec, backend):
        pytest.skip(f"op has no gradients on {backend}")
    _supports(spec, backend, dtype)
    _control(spec, dtype, case, backend)
    mod, orig, outs = _backward_outputs(spec, dtype, case, monkeypatch, backend)
    for i in outs:
        def backward(*a, _i=i, **k):
            def wrong(g):
                g = g.clone()
                flat = g.view(-1)
                j = int(flat.float().abs().argmax())
                if dtype == torch.float32:
                    # a small but real error at the largest gradient: >= 1e-3, 10x the loosest
                    # fp32 gradient tolerance of any spec (atol 1e-4)
                    flat[j] = flat[j] + 1e-3 * flat[j].abs() + 1e-3
                else:
                    flat[j] = -flat[j]          # a sign error at the largest gradient
                return g
            return _map_index(orig(*a, **k), _i, wrong)

        monkeypatch.setattr(mod, "backward", backward)
        r = run_case(spec, backend, dtype, case)
        assert not r.ok, f"a wrong gradient (backward output {i}) went unnoticed"
        assert "grad" in r.why, r.why


@pytest.mark.parametrize("spec,case", _params())
def test_wrong_output_dtype_is_caught(spec, case, monkeypatch):
    mod = _cpu_module(spec)
    orig = mod.forward
    monkeypatch.setattr(mod, "forward", lambda *a, **k: _map_first(orig(*a, **k), lambda y: y.float()))
    r = run_case(spec, "cpu", torch.bfloat16, case, grads=False)
    assert not r.ok


def _extreme_params():
    out = []
    for name, spec in sorted(tessera.OPS.items()):
        if "cpu" not in spec.kernels or spec.mutates:
            continue
        for case in spec.cases:
            if "extreme" in case.tags and "large" not in case.tags:
                out += [pytest.param(spec, case, dt, id=f"{name}-{case.name}-{str(dt)[6:]}")
                        for dt in (torch.float16, torch.bfloat16) if dt in spec.dtypes]
    return out


@pytest.mark.parametrize("spec,case,dtype", _extreme_params())
def test_all_zero_output_on_extreme_case_is_caught(spec, case, dtype, monkeypatch):
    """A kernel returning zeros must fail wherever the reference is not itself ~zero, even where the
    plain-PyTorch baseline breaks (before: rms_norm's hand-written fp16 eager squared values near
    65504 to inf and returned zeros, the 2x rule's bound became 2 * max|ref|, and an all-zero
    output passed near-fp16-max)."""
    gen = torch.Generator().manual_seed(seed_for(f"{spec.name}/{case.name}/{dtype}"))
    kw = case.make(dtype, torch.device("cpu"), gen)
    ref = spec.ref(**{k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.element_size() > 1
                          else v) for k, v in kw.items()})
    ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).detach()
    if tolerance.exact_dtype(ref.dtype):
        pytest.skip("output 0 is an integer/fp8 format: bit-exact, no float tolerance to probe")
    r_cast = ref.to(dtype).double()
    fin = torch.isfinite(r_cast)
    if bool(fin.all()) and (ref.numel() == 0 or float(ref.abs().max()) <= tolerance.ZERO_LEVEL):
        pytest.skip("the reference is itself ~zero: an all-zero output is right")
    r = run_case(spec, "cpu", dtype, case, grads=False)
    assert r.ok, f"control run fails before any bug is planted: {r.why}"
    mod = _cpu_module(spec)
    orig = mod.forward
    monkeypatch.setattr(mod, "forward", lambda *a, **k: _map_first(orig(*a, **k), torch.zeros_like))
    r = run_case(spec, "cpu", dtype, case, grads=False)
    assert not r.ok, f"an all-zero output went unnoticed (reference max {float(ref[torch.isfinite(ref)].abs().max()):.3g})"


@pytest.mark.parametrize("op", ["linear_w8a8", "linear_fp8"])
def test_unquantized_activations_are_caught(op, monkeypatch):
    """The w8a8 / fp8 eager baselines quantize x per token like the kernels, so their error is float
    rounding only: a kernel that skips the activation quantization (here the exact float64 product
    of unquantized x, so its error is that quantization noise alone) must fail in fp16.  Before, the
    baseline ran on unquantized x, its error *was* that noise, and the 2x rule let such a kernel pass."""
    from tessera.ops._qlinear_int8.ref import activate
    from tessera.ops.linear_fp8.ref import dequantize_weight
    spec = tessera.OPS[op]
    case = _richest_case(spec)
    assert run_case(spec, "cpu", torch.float16, case, grads=False).ok
    mod = _cpu_module(spec)

    def forward(x, weight, scale, bias, activation):
        w = dequantize_weight(weight, scale) if op == "linear_fp8" else weight.double() * scale.double()[:, None]
        y = x.double() @ w.T + (0 if bias is None else bias.double())
        return activate(y, activation).to(x.dtype)

    monkeypatch.setattr(mod, "forward", forward)
    r = run_case(spec, "cpu", torch.float16, case, grads=False)
    assert not r.ok, f"{op}: a kernel that does not quantize its activations went unnoticed"


# ---------------------------------------------------------------- the tolerance rule itself

def test_compare_rules():
    ref = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    ok = tolerance.compare(ref.float(), ref, None, torch.float32)
    assert ok.ok
    nan = ref.float().clone()
    nan[1] = float("nan")
    assert not tolerance.compare(nan, ref, None, torch.float32).ok
    inf_ref = torch.tensor([float("inf"), 1.0], dtype=torch.float64)
    assert tolerance.compare(inf_ref.float(), inf_ref, None, torch.float32).ok
    assert not tolerance.compare(-inf_ref.float(), inf_ref, None, torch.float32).ok
    assert not tolerance.compare(torch.tensor([1.0, 1.0]), inf_ref, None, torch.float32).ok
    # overflow to inf in the output dtype is right where the exact result exceeds the dtype's range
    big = torch.tensor([1e6, 1.0], dtype=torch.float64)
    assert tolerance.compare(big.half(), big, big.half(), torch.float16).ok
    assert not tolerance.compare(ref[:2].float(), ref, None, torch.float32).ok      # shape
    assert not tolerance.compare(ref.half(), ref, ref.half(), torch.float32).ok     # dtype
    off = ref.float().clone()
    off[0] += 1e-4
    assert not tolerance.compare(off, ref, None, torch.float32).ok
    assert tolerance.compare(off, ref, None, torch.float32, tol=(0.0, 2e-4)).ok


def test_low_precision_rule_is_per_element_and_capped():
    """fp16/bf16: |out - ref| <= min(2 * max|eager - ref|, max|ref| / 8) + ~1 ulp of each ref."""
    ref = torch.tensor([40000.0, -30000.0, 3.0, -0.5, 0.0], dtype=torch.float64)
    h = ref.half()
    assert tolerance.compare(h, ref, h, torch.float16).ok           # exact eager: rounding passes
    # a broken baseline (eager overflowed and returned zeros: its error is the whole output) no
    # longer admits an all-zero output, nor one off by half its value (old bound: 2 * max|ref|)
    zeros = torch.zeros_like(h)
    assert not tolerance.compare(zeros, ref, zeros, torch.float16).ok
    assert not tolerance.compare((ref * 0.5).half(), ref, zeros, torch.float16).ok
    assert not tolerance.compare(-h, ref, zeros, torch.float16).ok
    # ... but a kernel within the cap (max|ref| / 8 = 5000 here) still passes next to it
    near = (ref + torch.tensor([4500.0, -4500.0, 4500.0, 0.0, 0.0], dtype=torch.float64)).half()
    assert tolerance.compare(near, ref, zeros, torch.float16).ok
    assert not tolerance.compare((ref + 5200.0).half(), ref, zeros, torch.float16).ok
    # eager NaN/inf where the reference is finite gives no allowance (not an infinite bound)
    nan_lp = torch.full_like(h, float("nan"))
    assert not tolerance.compare(zeros, ref, nan_lp, torch.float16).ok
    assert tolerance.compare(h, ref, nan_lp, torch.float16).ok
    # the per-element floor: about one ulp of each element's own value, not of the largest one
    small = ref.clone()
    small_out = h.clone()
    small_out[2] = float(ref[2]) + 0.1        # 3.0 off by 0.1 = ~50 ulp at 3, < 1 ulp at 40000
    assert not tolerance.compare(small_out, small, h, torch.float16).ok
    # a reference that is itself ~zero (below 2^-24) accepts zeros next to a noisy baseline
    tiny = torch.tensor([1e-15, -2e-15, 0.0], dtype=torch.float64)
    noisy = torch.tensor([3e-7, -1e-7, 2e-7], dtype=torch.bfloat16)
    assert tolerance.compare(torch.zeros(3, dtype=torch.bfloat16), tiny, noisy, torch.bfloat16).ok


# ---------------------------------------------------------------- gradients are poisoned too

@pytest.mark.parametrize("spec,case,backend", _backend_params())
def test_unwritten_gradient_element_is_caught(spec, case, backend, monkeypatch):
    """A backward kernel leaving the last element of a gradient unwritten must fail the cell: run_case
    poisons the buffers new_output allocates during the backward pass as well (before, gradients were
    allocated outside the poisoning, so the element held whatever the allocator left there)."""
    if not spec.grad_inputs or not has_backward(spec, backend):
        pytest.skip(f"op has no gradients on {backend}")
    _control(spec, torch.float32, case, backend)
    mod, orig, outs = _backward_outputs(spec, torch.float32, case, monkeypatch, backend)
    for i in outs:
        def backward(*a, _i=i, **k):
            def drop_last(g):
                fresh = new_output(g.shape, g.dtype, g.device)   # poisoned by run_case, backward too
                fresh.view(-1)[:-1] = g.reshape(-1)[:-1]
                return fresh
            return _map_index(orig(*a, **k), _i, drop_last)

        monkeypatch.setattr(mod, "backward", backward)
        r = run_case(spec, backend, torch.float32, case)
        assert not r.ok, f"an unwritten element of backward output {i} went unnoticed"
        assert "grad" in r.why and ("non-finite" in r.why or "NaN" in r.why), r.why


def test_fp32_rule_with_an_eager_baseline_is_the_fuzz_fallback():
    """The fuzz passes fp32 eager for ill-conditioned draws: an error past the fp32 defaults passes
    only within 2x torch fp32's own error, and a zeroed output still fails at the cap."""
    ref = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    off = ref.float().clone()
    off[0] += 1e-4                                              # past atol 1e-5 + rtol*|ref|
    assert not tolerance.compare(off, ref, None, torch.float32).ok
    lp = ref.float().clone()
    lp[1] += 6e-5                                               # torch fp32 is itself off by 6e-5
    assert tolerance.compare(off, ref, lp, torch.float32).ok    # 1e-4 <= 2 x 6e-5
    worse = ref.float().clone()
    worse[0] += 2e-4
    assert not tolerance.compare(worse, ref, lp, torch.float32).ok
    broken = torch.zeros(3)                                     # an eager that returns zeros ...
    assert not tolerance.compare(torch.zeros(3), ref, broken, torch.float32).ok  # ... admits no zeros
