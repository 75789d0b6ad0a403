"""The benchmark matrix: every op's ``bench_cases`` x dtype x direction x backend.

Generic over ``tessera.OPS``: an op takes part as soon as its spec has
``bench_cases`` and a ``bytes_fwd`` model (``bytes_bwd`` for the backward rows).

For each row three contenders and the row's ceiling are timed in the same
interleaved loop (:func:`tessera.bench.timing.time_interleaved`):

* ``tessera``  -- ``spec.fn(**inputs, backend=<backend>)``;
* ``eager``    -- ``spec.eager`` (what a user writes in plain PyTorch, input dtype);
* ``compile``  -- ``torch.compile(spec.eager, fullgraph=True, dynamic=False)``;
* peers        -- forward rows only: other libraries' kernels from ``spec.peers`` (torch's
  int8/int4 CPU GEMMs, ONNX Runtime, the dequantize-once-then-F.linear baseline), each
  prepared once outside the timed loop (checked against the reference in
  tests/test_bench_peers.py);
* the ceiling  -- memory-bound ops (``spec.bound == "memory"``): a non-temporal C copy
  moving the row's byte count (read + written); read-bound ops (``"read"``: a KV cache,
  a GEMV's weight): a read-only pass over the row's bytes (see
  :func:`roofline.ceiling_callable`).  Bandwidth on a shared VM drifts by tens of percent
  within minutes, so each row carries its own, timed in its loop: the fast quartile of its
  samples is the ceiling, (p90 - p10) / median its spread.  Compute-bound ops: the register-only peak probe
  of ``spec.compute_dtype`` (fp32 FMA / bf16 VDPBF16PS / int8 VPDPBUSD / AMX), likewise;
* DRAM, not cache -- read-bound forward rows whose bytes fit the LLC cycle every contender,
  peer and the ceiling through ``roofline.rotation(bytes)`` copies of the inputs (together
  > 2x LLC), so a 16 MiB weight is not read warm; rows left cache-resident say so;
* the layout read -- forward rows of ops with ``spec.layout_read`` (paged decode): a plain
  read of the row's bytes in the op's own memory layout (scattered pages), no compute.

Forward rows call each under ``torch.no_grad``.  Backward rows run each
contender's forward once with ``requires_grad`` leaves (``spec.grad_inputs``), then
time ``torch.autograd.grad(outs, leaves, ups, retain_graph=True)`` with the same
upstream gradients ``ups`` for all three, in the memory format of the output (channels-last
for a channels-last conv): only the backward pass is in the number.

Each (case, dtype, direction) starts from ``torch._dynamo.reset()`` and compiles
with ``dynamic=False``: every shape gets its own static graph (what a user with
fixed shapes gets), and dynamo's recompile limit can never silently turn the
compiled baseline back into eager.

``shape_scale`` < 1 (``--quick``, tests) shrinks the leading (row/batch) dimension:
every input with >= 2 dims whose first dim equals the first such input's is cut
to ``round(rows * scale)`` rows.  Only row-wise ops (``spec.fuzz == "rows"``: norms,
activations, GLUs, softmax) are shrunk, as only they stay valid; ops with index or
sequence structure (attention, paged caches, rope tables) run full size.  The actual
shapes are recorded in every row.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .._registry import OpSpec, has_backward, supports
from .._cases import seed_for
from . import roofline, timing

DIRECTIONS = ("fwd", "bwd")
# calls shorter than this get one untimed call before each sample (timing.time_interleaved): the
# previous contender's spinning thread pools disturb the next few ms; longer calls absorb it
REWARM_BELOW_S = 0.02
ROOF = "_roofline"  # the per-row ceiling's entry in the interleaved loop (not a contender)
LAYOUT = "_layout_read"  # OpSpec.layout_read's entry (not a contender either)
ROW_BUDGET_S = 15.0  # timed seconds per row at most (slow rows get fewer samples, >= 3)


@dataclasses.dataclass
class Plan:
    spec: OpSpec
    case: object          # tessera._registry.Case
    dtype: torch.dtype
    direction: str
    backends: tuple[str, ...]


def dtype_name(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dt, str(dt).replace("torch.", ""))


def plans(ops: list[OpSpec], dtypes, backends, device: torch.device, directions=DIRECTIONS,
          extended: bool = False) -> tuple[list[Plan], list[str]]:
    """Every measurement to make, and a note for each combination that cannot run here.
    Bench cases tagged ``extended`` (long, e.g. batch-4 seq-4096 attention) run only when asked."""
    out, notes = [], []
    for spec in ops:
        if not spec.bench_cases or spec.bytes_fwd is None:
            notes.append(f"{spec.name}: no bench_cases/bytes_fwd in its spec, not benchmarked")
            continue
        for case in spec.bench_cases:
            if "extended" in case.tags and not extended:
                continue
            for dt in dtypes:
                if dt not in spec.dtypes:
                    notes.append(f"{spec.name}: dtype {dtype_name(dt)} not in the op's dtypes")
                    continue
                runnable = []
                for b in backends:
                    ok, why = supports(spec, b, device, dt)
                    if ok:
                        runnable.append(b)
                    else:
                        notes.append(f"{spec.name}/{b}/{dtype_name(dt)}: {why}")
                if not runnable:
                    continue
                for d in directions:
                    if d == "bwd" and (not spec.grad_inputs or spec.bytes_bwd is None or "nograd" in case.tags):
                        continue
                    run = runnable
                    if d == "bwd":   # a forward-only kernel module (BACKWARD = False) has no bwd row
                        run = [b for b in runnable if has_backward(spec, b)]
                        notes.extend(f"{spec.name}/{b}: forward only" for b in runnable if b not in run)
                    if run:
                        out.append(Plan(spec, case, dt, d, tuple(run)))
    return out, sorted(set(notes))


def make_inputs(spec: OpSpec, case, dtype: torch.dtype, device: torch.device, scale: float = 1.0) -> dict:
    gen = torch.Generator().manual_seed(seed_for(f"bench/{spec.name}/{case.name}/{dtype}"))
    kw = case.make(dtype, device, gen)
    if scale != 1.0 and spec.fuzz == "rows":  # only row-wise ops (see the module docstring)
        lead = next((v.shape[0] for v in kw.values() if isinstance(v, torch.Tensor) and v.dim() >= 2), None)
        if lead is not None:
            m = max(1, round(lead * scale))
            kw = {k: (v[:m].clone() if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[0] == lead else v)
                  for k, v in kw.items()}
    return kw


def shapes(kw: dict) -> str:
    return " ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in kw.items() if isinstance(v, torch.Tensor))


def _in_layout_of(g: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """The upstream gradient ``g`` in the memory format of the output ``o``: what the next layer's
    backward hands over in a network (a channels-last conv's dy is channels-last).  An NCHW dy
    under a channels-last output would time a layout reorder in every contender instead."""
    if o.dim() == 4 and not o.is_contiguous() and o.is_contiguous(memory_format=torch.channels_last):
        return g.contiguous(memory_format=torch.channels_last)
    return g


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _tessera(spec: OpSpec, backend: str) -> Callable:
    return lambda **kw: spec.fn(**kw, backend=backend)


def _contenders(p: Plan, compiled: Callable) -> dict[str, Callable]:
    fns = {f"tessera-{b}": _tessera(p.spec, b) for b in p.backends}
    fns["eager"] = p.spec.eager
    if compiled is not None:
        fns["compile"] = compiled
    return fns


def _fwd_callables(fns: dict[str, Callable], kw: dict) -> dict[str, Callable]:
    def call(f):
        def run():
            with torch.no_grad():
                return f(**kw)
        return run
    return {k: call(f) for k, f in fns.items()}


def _bwd_callables(p: Plan, fns: dict[str, Callable], kw: dict, errors: dict) -> dict[str, Callable]:
    """Forward once per contender (graph kept), then a closure that times only autograd.grad."""
    gen = torch.Generator().manual_seed(seed_for(f"bench-ups/{p.spec.name}/{p.case.name}"))
    ups = None
    out = {}
    for name, f in fns.items():
        leaves_kw = {k: (v.detach().requires_grad_(True)
                         if isinstance(v, torch.Tensor) and k in p.spec.grad_inputs and v.is_floating_point() else v)
                     for k, v in kw.items()}
        leaves = [v for k, v in leaves_kw.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        try:
            outs = [o for o in _tuple(f(**leaves_kw)) if isinstance(o, torch.Tensor) and o.requires_grad]
        except Exception as e:
            errors[name] = timing._err(e)
            continue
        if ups is None:  # the same upstream gradients for every contender
            ups = [_in_layout_of(torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.device, o.dtype), o)
                   for o in outs]
        if len(outs) != len(ups):
            errors[name] = f"returned {len(outs)} differentiable outputs, expected {len(ups)}"
            continue

        def run(outs=outs, leaves=leaves):
            return torch.autograd.grad(outs, leaves, ups, retain_graph=True, allow_unused=True)
        out[name] = run
    return out


def _copies(kw: dict, n: int) -> list[dict]:
    """``kw`` and n - 1 clones of its tensors (the rotation of a read-bound row)."""
    return [kw] + [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
                   for _ in range(n - 1)]


def _prime(per_copy: list[dict]) -> None:
    """Call tessera once on every copy of a rotated row's inputs, untimed.  A launch may keep
    state per weight tensor (the dispatch vendor route's dequantized weight, conv2d's packed
    weights) and builds it on its first call with that tensor, as a model does on its first
    forward.  The warm-up calls reach only the first copies, so without this every timed call of
    a 35-copy row was a first call: linear_w4a16 M16 bf16 timed its dequantization each time,
    33 ms against 1.9 ms for dequant+matmul.  (The peers build their per-copy state in their
    factories; eager and compile keep none.)"""
    for c in per_copy:
        for name, f in c.items():
            if name.startswith("tessera-"):
                try:
                    f()
                except Exception:  # noqa: BLE001 -- the timed loop reports it
                    pass


def _rotating(fs: list[Callable]) -> Callable:
    """One callable that calls the next of ``fs`` each time (each on its own copy of the inputs)."""
    if len(fs) == 1:
        return fs[0]
    turn = [0]

    def run():
        turn[0] = (turn[0] + 1) % len(fs)
        return fs[turn[0]]()
    return run


def measure(p: Plan, repeats: int, device: torch.device, kw: dict, warmup: int = 2,
            peaks: dict | None = None, with_compile: bool = True) -> dict:
    """One benchmark row: medians for every contender plus bytes; ratios are added by the report.

    ``kw`` (from :func:`make_inputs`) is shared by the fwd and bwd rows of a case:
    nothing here writes to it (backward rows make detached leaves).  ``peaks``: the header's
    :func:`roofline.compute_peaks` (measured here if a compute-bound row comes without them).
    """
    torch._dynamo.reset()
    compiled = torch.compile(p.spec.eager, fullgraph=True, dynamic=False) if with_compile else None
    fns = _contenders(p, compiled)
    errors: dict[str, str] = {}
    nbytes = (p.spec.bytes_fwd if p.direction == "fwd" else p.spec.bytes_bwd)(kw)
    flops_fn = p.spec.flops_fwd if p.direction == "fwd" else p.spec.flops_bwd
    bound = p.spec.bound(kw) if callable(p.spec.bound) else p.spec.bound
    flops = flops_fn(kw) if (bound == "compute" and flops_fn is not None) else None
    kind = "compute" if flops else ("read" if bound == "read" else "memory")
    # a read-bound row (a GEMV's weight, a KV cache) must read DRAM: every contender cycles
    # through enough copies of the inputs to exceed the LLC twice (roofline.rotation)
    rot = roofline.rotation(nbytes) if (kind == "read" and device.type == "cpu" and p.direction == "fwd") else 1
    kws = _copies(kw, rot)
    if p.direction == "fwd":
        per_copy = [_fwd_callables(fns, k) for k in kws]
        calls = {name: _rotating([c[name] for c in per_copy]) for name in fns}
        if rot > 1:
            _prime(per_copy)
        for name, factory in p.spec.peers.items():
            try:
                peer = [factory(k) for k in kws]
            except Exception as e:  # a peer that fails to set up is reported, not fatal
                peer = [timing._err(e)]
            if isinstance(peer[0], str):
                errors[name] = peer[0]
                continue
            fns[name] = peer[0]
            calls[name] = _rotating([_fwd_callables({name: lambda f=f: f()}, {})[name] for f in peer])
    else:
        calls = _bwd_callables(p, fns, kw, errors)
    # the row's own ceiling, timed in the same interleaved loop as the contenders (drift of the
    # machine moves the ceiling and the op together): memory/read rows a copy / read pass of their
    # bytes (its fast quartile: timing.Timing.fast_quartile), compute rows the register-only peak
    # of their arithmetic's dtype (its best sample: noise only ever slows a register loop)
    cdt = None
    if kind == "compute" and device.type == "cpu":
        cdt = p.spec.compute_dtype(kw) if callable(p.spec.compute_dtype) else p.spec.compute_dtype
        ceiling = roofline.peak_callable(peaks or roofline.compute_peaks(repeats=3), cdt)
    else:
        ceiling = roofline.ceiling_callable(kind, nbytes, device, rotate=rot)
    if ceiling is not None:
        calls[ROOF] = ceiling[0]
    layout = None
    if p.spec.layout_read is not None and p.direction == "fwd":
        lays = [p.spec.layout_read(k) for k in kws]
        layout = None if lays[0] is None else _rotating(lays)
    if layout is not None:
        calls[LAYOUT] = layout
    res = timing.time_interleaved(calls, repeats, warmup=warmup, device=device, budget_s=ROW_BUDGET_S,
                                  rewarm_below_s=REWARM_BELOW_S)
    roof_t, layout_t = res.pop(ROOF, None), res.pop(LAYOUT, None)
    first = next((v for v in kw.values() if isinstance(v, torch.Tensor)), None)
    row = {"op": p.spec.name, "case": p.case.name, "dtype": dtype_name(p.dtype), "dir": p.direction,
           "shape": "x".join(map(str, first.shape)) if first is not None else "", "shapes": shapes(kw),
           "bytes": int(nbytes), "repeats": max((len(t.samples) for t in res.values()), default=0),
           "ms": {}, "spread": {}, "inner": {},
           "errors": errors, "bound": kind, "flops": flops,
           "roof": None, "layout_roof": None, "rotated": rot,
           # bytes a call touches that stay in the LLC between calls: a warm-cache number
           "cache_resident": kind != "compute" and nbytes * rot <= roofline.llc_bytes()}
    if ceiling is not None and roof_t is not None and roof_t.best:
        # GB/s of the copy (read + written) or of the read pass: this row's denominator, the fast
        # quartile of its interleaved samples (a compute peak: the best); spread = (p90 - p10) /
        # median of those samples
        t_roof = roof_t.best if cdt is not None else roof_t.fast_quartile
        row["roof"] = {"kind": ceiling[2], "rate": ceiling[1] / t_roof / 1e9,
                       "spread": None if roof_t.spread90 is None else round(roof_t.spread90, 3)}
        if cdt is not None:
            row["roof"]["dtype"] = cdt
    if layout_t is not None and layout_t.best:  # the op's bytes read plainly in its own layout
        row["layout_roof"] = {"rate": nbytes / layout_t.fast_quartile / 1e9,
                              "spread": None if layout_t.spread90 is None else round(layout_t.spread90, 3)}
    for name in fns:
        t = res.get(name)
        if t is None:
            row["ms"][name] = None
            continue
        row["ms"][name] = None if t.median is None else t.median * 1e3
        row["spread"][name] = None if t.spread is None else round(t.spread, 3)
        row["inner"][name] = t.inner
        if t.error:
            errors[name] = t.error
    del calls, fns, compiled
    return row


def tiny_case(spec: OpSpec):
    """The smallest plain test case of an op (for per-call overhead), or None."""
    skip = {"large", "layout", "extreme", "empty"}
    best, best_n = None, None
    for case in spec.cases:
        if skip & set(case.tags):
            continue
        kw = case.make(spec.dtypes[0], torch.device("cpu"), torch.Generator().manual_seed(0))
        n = sum(v.numel() for v in kw.values() if isinstance(v, torch.Tensor))
        if n > 0 and (best_n is None or n < best_n):
            best, best_n = case, n
    return best


def overhead(spec: OpSpec, backends, device: torch.device, calls: int = 200, repeats: int = 15) -> dict | None:
    """Per-call microseconds on the op's tiniest input: tessera (per backend), eager, a no-op custom op."""
    case = tiny_case(spec)
    if case is None:
        return None
    dt = spec.dtypes[0]
    kw = case.make(dt, device, torch.Generator().manual_seed(0))
    fns = {f"tessera-{b}": (lambda b=b: spec.fn(**kw, backend=b)) for b in backends
           if supports(spec, b, device, dt)[0]}
    fns["eager"] = lambda: spec.eager(**kw)
    first = next(v for v in kw.values() if isinstance(v, torch.Tensor))
    noop = timing.noop_op()
    fns["noop_custom_op"] = lambda: noop(first)
    us = timing.overhead_us(fns, calls=calls, repeats=repeats, device=device)
    return {"op": spec.name, "case": case.name, "dtype": dtype_name(dt), "shapes": shapes(kw), "us": us}
