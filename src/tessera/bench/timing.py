"""Wall-clock timing that survives a noisy 2-core VM.

Rules this module enforces for every number `tessera bench` prints:

* **warm-up first**: every callable runs ``warmup`` times before timing, so
  torch.compile's compilation, tessera's native JIT build and the first-touch
  page faults of lazily created buffers are never in a sample;
* **interleaving**: the contenders of one measurement (tessera, eager,
  torch.compile) are timed in turns, rotating who goes first, so a slow phase of
  the machine (another tenant, thermal or frequency change) hits all of them
  instead of biasing one;
* **medians** of many samples, never means or minima: the distribution here has
  a long right tail (OpenMP wake-ups of ~8 ms on sub-millisecond calls);
* **batching of short calls**: a sample is at least ``min_sample_s`` long, made
  of ``inner`` back-to-back calls, so timer resolution and Python's loop overhead
  do not dominate; the per-call time is the sample divided by ``inner``.

GPU tensors are synchronised around every sample (kernels launch asynchronously).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class Timing:
    """Samples (seconds per call) of one contender, or the error that stopped it."""

    samples: list[float] = dataclasses.field(default_factory=list)
    inner: int = 1
    error: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def spread(self) -> float | None:
        """Interquartile range relative to the median: how noisy this number is."""
        if len(self.samples) < 4:
            return None
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / statistics.median(self.samples)

    @property
    def best(self) -> float | None:
        """The fastest sample: a ceiling's estimate (its noise only ever slows it down)."""
        return min(self.samples) if self.samples else None

    @property
    def fast_quartile(self) -> float | None:
        """The 25th-percentile sample (the best one under 4 samples): a bandwidth ceiling's
        estimate.  Noise mostly slows a copy down, but on this shared VM single samples of a
        DRAM-sized copy also ran up to ~2x the run's bandwidth probe, so the fastest one alone
        is not a stable denominator; the fast quartile is robust to both kinds of outlier."""
        if len(self.samples) < 4:
            return self.best
        return statistics.quantiles(self.samples, n=4, method="inclusive")[0]

    @property
    def spread90(self) -> float | None:
        """(p90 - p10) / median, the spread reported beside a ceiling (None under 3 samples)."""
        if len(self.samples) < 3:
            return None
        q = statistics.quantiles(self.samples, n=10, method="inclusive")
        return (q[8] - q[0]) / statistics.median(self.samples)


def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, *, warmup: int = 2,
                     device: torch.device = torch.device("cpu"), min_sample_s: float = 2e-3,
                     inner: int | None = None, max_inner: int = 10_000,
                     budget_s: float | None = None, min_repeats: int = 3,
                     rewarm_below_s: float = 0.0) -> dict[str, Timing]:
    """Median-ready samples for each callable in ``fns``, timed in rotating turns.

    ``rewarm_below_s``: a callable whose call takes less than this gets one untimed call before
    each sample.  On the 2-core VM the thread pools of the previous contender (ORT's, torch's and
    our OpenMP threads all spin after a call) and the vCPUs they woke disturb the next call for
    up to a few ms: measured, a 0.36 ms W4A16 GEMV timed right after ORT's MatMulNBits took
    3.7 ms, and ORT's 0.54 ms took 1.2-1.7 ms right after ours.  The untimed call absorbs that, so
    each contender is timed in its own steady state (as in an application calling it layer after
    layer) while the rotation still cancels the machine's drift.

    A callable that raises (during warm-up or timing) is dropped with its error
    recorded; the others continue, so one failing baseline never hides the rest.
    ``inner`` forces the calls per sample (per-call overhead measurements);
    otherwise it is derived from the last warm-up call.  With ``budget_s``, rows whose
    calls are slow (attention: ~1 s each) take fewer samples, never under ``min_repeats``.
    """
    out = {name: Timing() for name in fns}
    live: list[str] = []
    cost: dict[str, float] = {}
    for name, fn in fns.items():
        try:
            dt = 0.0
            for _ in range(max(1, warmup)):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                dt = time.perf_counter() - t0
        except Exception as e:  # recorded in the report, never silently skipped
            out[name].error = _err(e)
            continue
        n = inner if inner is not None else min(max_inner, max(1, math.ceil(min_sample_s / max(dt, 1e-9))))
        out[name].inner = n
        live.append(name)
        cost[name] = dt * n
    if budget_s is not None and live:
        per_round = sum(cost.values())
        repeats = max(min_repeats, min(repeats, int(budget_s / max(per_round, 1e-9))))
    for r in range(repeats):
        k = r % len(live) if live else 0
        for name in live[k:] + live[:k]:
            t = out[name]
            if t.error:
                continue
            fn, n = fns[name], t.inner
            try:
                if cost[name] / n < rewarm_below_s:
                    fn()
                sync(device)
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                sync(device)
                t.samples.append((time.perf_counter() - t0) / n)
            except Exception as e:
                t.error, t.samples = _err(e), []
    return out


# ----------------------------------------------------------------------------- per-call overhead

_NOOP: list = []


def noop_op():
    """A ``torch.library.custom_op`` that does nothing: the floor of the dispatcher's cost.

    Defined on first use (not at import), in its own namespace, so it never shows
    up in ``tessera::`` and costs nothing unless a benchmark asks for it.
    """
    if not _NOOP:
        @torch.library.custom_op("tessera_bench::noop", mutates_args=())
        def _noop(x: torch.Tensor) -> torch.Tensor:
            return x.new_empty(0)

        @_noop.register_fake
        def _(x):
            return x.new_empty(0)

        _NOOP.append(_noop)
    return _NOOP[0]


def overhead_us(fns: dict[str, Callable[[], object]], *, calls: int = 200, repeats: int = 15,
                device: torch.device = torch.device("cpu")) -> dict[str, float | str]:
    """Median microseconds per call of tiny-input callables (``calls`` calls per sample)."""
    with torch.no_grad():
        res = time_interleaved(fns, repeats, warmup=3, device=device, inner=calls)
    return {k: (round(t.median * 1e6, 2) if t.median is not None else t.error) for k, t in res.items()}
