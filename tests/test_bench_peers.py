"""``OpSpec.peers``: other libraries' kernels are timed beside eager/compile in forward rows,
a peer that cannot run records its reason, and the report derives a speedup for each."""
import dataclasses
import time

import torch

import tessera
from tessera.bench import report, runner, timing


def test_peers_are_timed_and_reported():
    silu = tessera.OPS["silu"]
    calls = []

    def peer_ok(kw):
        x = kw["x"]
        return lambda: calls.append(1) or torch.nn.functional.silu(x)

    spec = dataclasses.replace(silu, name="silu_peers_test",
                               peers={"ok-peer": peer_ok, "missing-peer": lambda kw: "not installed here"})
    case = silu.bench_cases[0]
    plan = runner.Plan(spec, case, torch.float32, "fwd", ("cpu",))
    kw = runner.make_inputs(spec, case, torch.float32, torch.device("cpu"), scale=0.01)
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1), 10.0)
    assert calls, "the peer was never called"
    assert row["ms"]["ok-peer"] and row["ms"]["ok-peer"] > 0
    assert row["errors"]["missing-peer"] == "not installed here"
    sp = row["speedup"]["tessera-cpu"]
    assert set(sp) >= {"eager", "compile", "ok-peer"} and sp["ok-peer"] > 0
    assert "ok-peer" in report.table([row])


def test_read_bound_rows_are_judged_against_a_read_pass():
    """``bound="read"`` (a KV cache, a GEMV's weight): the row's ceiling is a read-only pass over
    the row's bytes, labelled as such, and the start-of-run probe reports its rate too."""
    silu = tessera.OPS["silu"]
    spec = dataclasses.replace(silu, name="silu_read_test", bound="read")
    plan = runner.Plan(spec, silu.bench_cases[0], torch.float32, "fwd", ("cpu",))
    kw = runner.make_inputs(spec, silu.bench_cases[0], torch.float32, torch.device("cpu"), scale=0.01)
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1), 10.0)
    assert row["bound"] == "read" and row["roof"]["kind"] == "read GB/s" and row["roof"]["rate"] > 0
    assert row["pct_roofline"]["tessera-cpu"] > 0 and "GB/s rd" in report.table([row])
    assert tessera.OPS["decode_attention"].bound == "read"
    bw = runner.roofline.memory_bandwidth(mib=8, repeats=2)
    assert bw["read_gbps"] > 0 and bw["nt_copy_gbps"] > 0


def test_short_calls_get_an_untimed_call_before_each_sample():
    """Calls under ``rewarm_below_s`` run once untimed before each timed sample (the previous
    contender's spinning threads disturb the next few ms on a 2-core VM); longer ones do not."""
    from tessera.bench import timing
    counts = {"fast": 0, "slow": 0}

    def fast():
        counts["fast"] += 1

    def slow():
        counts["slow"] += 1
        time.sleep(0.004)

    res = timing.time_interleaved({"fast": fast, "slow": slow}, 3, warmup=1, rewarm_below_s=0.003)
    n_fast, n_slow = res["fast"].inner, res["slow"].inner
    assert len(res["fast"].samples) == len(res["slow"].samples) == 3
    assert counts["fast"] == 1 + 3 * (n_fast + 1) and counts["slow"] == 1 + 3 * n_slow


def test_paged_decode_rows_carry_the_layout_read():
    """``OpSpec.layout_read`` (paged decode): forward rows time a plain read of the same scattered
    pages with the contenders and state the op's rate as a fraction of it; other rows have none."""
    spec = tessera.OPS["decode_attention"]
    case = next(c for c in spec.cases if c.name == "b2-long-1500")
    plan = runner.Plan(spec, case, torch.bfloat16, "fwd", ("cpu",))
    kw = runner.make_inputs(spec, case, torch.bfloat16, torch.device("cpu"))
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1), 10.0)
    assert row["layout_roof"]["rate"] > 0 and row["pct_layout"]["tessera-cpu"] > 0
    assert "%layout" in report.table([row]) and "of the layout read" in report.progress_line(1, 1, row)
    silu = tessera.OPS["silu"]
    plan = runner.Plan(silu, silu.bench_cases[0], torch.float32, "fwd", ("cpu",))
    kw = runner.make_inputs(silu, silu.bench_cases[0], torch.float32, torch.device("cpu"), scale=0.01)
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1), 10.0)
    assert row["layout_roof"] is None and row["pct_layout"]["tessera-cpu"] is None


# ----------------------------------------------------------------------------- peers are checked
# Item 6 of issue #13: every peer in ``OpSpec.peers`` must compute the op, or a wrong layout,
# nibble order or zero point would be timed and reported as a speed.  Each peer is built by its
# factory on small bench-like kwargs and its output judged by tessera's float rule
# (``tessera.testing.tolerance.compare``) against the float64 reference of WHAT THAT PEER
# COMPUTES.  The rule per peer:
#   * weight-only peers (torch int8pack / int4pack, ORT MatMulNBits accuracy_level 0,
#     dequant+matmul) keep x in float: reference = act(x @ dequant(w).T + bias) in float64 (for
#     W8A8 / W4A8 / FP8 too: those peers do not quantize x).  fp32: the fp32 defaults (rtol
#     1.3e-6, atol 1e-5) plus the worst-case rounding of a K-term fp32 dot product (Higham's
#     gamma_K: K * 2^-24 * sum_k |x_k w_nk|; the ops' own fp32_tol assume exact integer
#     accumulators and do not cover a float GEMM); bf16 / fp16 = ``compare``'s 2x rule against
#     plain torch F.linear in that dtype on the same dequantized weight (computed here,
#     independently of the peer's own conversion);
#   * ORT MatMulNBits accuracy_level 4 quantizes x to int8 itself, in blocks of its own choice:
#     each x element moves by at most half a step <= amax(row) / 254, so
#     |y - ref| <= 0.51 * amax(row) / 127 * sum_k |w[n, k]| (x 1.2 for an activation: gelu/silu
#     slopes are < 1.13) + the fp32 tolerance.  A wrong layout / zero point errs by ~sqrt(K) |w|.
import pytest  # noqa: E402

from tessera.ops._qlinear_int4 import quantize_weight as _q4  # noqa: E402
from tessera.ops._qlinear_int8.ref import activate as _act  # noqa: E402
from tessera.testing.tolerance import compare as _compare  # noqa: E402

_PEER_PAIRS = [(op, peer) for op, s in sorted(tessera.OPS.items()) for peer in s.peers]
_K, _N = 256, 64


def _peer_kwargs(op, M, dtype, gen, group=128, zp=False, bias=False, act=None):
    """(kwargs, float64 dequantized weight [N, K]) for a quantized linear."""
    x = torch.randn(M, _K, generator=gen).to(dtype)
    kw = {"x": x, "bias": (torch.randn(_N, generator=gen).to(dtype) if bias else None), "activation": act}
    if op in ("linear_w8a8", "linear_a16w8"):
        w = torch.randint(-127, 128, (_N, _K), generator=gen, dtype=torch.int8)
        s = torch.rand(_N, generator=gen) * 0.02 + 1e-3
        kw.update(weight=w, weight_scale=s)
        return kw, w.double() * s.double()[:, None]
    if op in ("linear_w4a16", "linear_w4a8"):
        w, s, z = _q4(torch.randn(_N, _K, generator=gen), group, zp)
        kw.update(weight=w, weight_scale=s, weight_zero=z, group_size=group)
        from tessera.ops._qlinear_int4.ref import _codes_minus_zero
        return kw, _codes_minus_zero(w, z, group) * s.double().repeat_interleave(group, 1)
    if op == "linear_fp8":
        import importlib
        fc = importlib.import_module("tessera.ops.linear_fp8.cases")  # the package re-exports cases()
        fr = importlib.import_module("tessera.ops.linear_fp8.ref")
        w, s = fc.make_weight(_N, _K, "row", fc.E4M3, gen)
        kw.update(weight=w, weight_scale=s)
        return kw, fr.dequantize_weight(w, s)
    raise AssertionError(f"no kwargs builder for peers of {op}: add one (every peer must be checked)")


def _variants():
    for M in (1, 16, 64):
        for dtype in (torch.float32, torch.bfloat16):
            yield dict(M=M, dtype=dtype)
    yield dict(M=5, dtype=torch.float32, group=32, zp=True, bias=True, act="silu")
    yield dict(M=3, dtype=torch.bfloat16, group=32, zp=True, bias=True, act="gelu")


@pytest.mark.parametrize("op,peer", _PEER_PAIRS, ids=[f"{o}-{p}" for o, p in _PEER_PAIRS])
def test_every_peer_computes_the_op(op, peer):
    spec = tessera.OPS[op]
    factory, ran, skipped = spec.peers[peer], 0, []
    for i, v in enumerate(_variants()):
        gen = torch.Generator().manual_seed(1000 + i)
        kw, w64 = _peer_kwargs(op, v["M"], v["dtype"], gen, v.get("group", 128), v.get("zp", False),
                               v.get("bias", False), v.get("act"))
        fn = factory(kw)
        if isinstance(fn, str):  # cannot run this row here: its reason, as the bench records it
            skipped.append(f"{v}: {fn}")
            continue
        out = fn()
        assert isinstance(out, torch.Tensor), f"{op}/{peer} returned {type(out)}, not its output"
        x, b, dt = kw["x"], kw["bias"], v["dtype"]
        pre = x.double() @ w64.T + (0 if b is None else b.double())
        ref = _act(pre, kw["activation"])
        tol = spec.fp32_tol.get(0)
        if peer.endswith("-a8"):
            assert out.dtype == dt and out.shape == ref.shape, f"{op}/{peer}: {out.shape} {out.dtype}"
            step = x.double().abs().amax(-1, keepdim=True) / 127
            lim = 0.51 * step * w64.abs().sum(1)[None, :] * (1.2 if kw["activation"] else 1.0)
            rtol, atol = tol or (1.3e-6, 1e-5)
            err = (out.double() - ref).abs()
            bad = err > lim + atol + rtol * ref.abs()
            assert not bool(bad.any()), (f"{op}/{peer} {v}: {int(bad.sum())} of {bad.numel()} outputs off by "
                                         f"more than int8 activation rounding allows (max err "
                                         f"{float(err.max()):.3g}, bound {float(lim.max()):.3g})")
        else:
            ref_lp, tol = None, None
            if dt == torch.float32:
                dot = x.double().abs() @ w64.abs().T + (0 if b is None else b.double().abs())
                tol = (1.3e-6, 1e-5 + float((_K * 2.0**-24 * dot).max()))
            else:
                ref_lp = _act(torch.nn.functional.linear(x, w64.to(dt), None if b is None else b.to(dt)),
                              kw["activation"])
            verdict = _compare(out, ref, ref_lp, dt, tol)
            assert verdict.ok, f"{op}/{peer} {v}: {verdict.why} (max err {verdict.err:.3g}, bound {verdict.bound:.3g})"
        ran += 1
    if peer.startswith("ort-"):
        pytest.importorskip("onnxruntime", reason="ORT peers need the bench extra (pip install onnxruntime onnx)")
    assert ran, f"{op}/{peer} ran on none of the variants: {skipped}"


# ----------------------------------------------------------------------------- ceilings (items 8-10)

@pytest.fixture(scope="module")
def peaks():
    return runner.roofline.compute_peaks(repeats=2, iters=200_000)


@pytest.mark.parametrize("op,dtype,want", [("linear_w8a8", torch.float32, "int8"), ("linear_w4a8", torch.float32, "int8"),
                                           ("linear_w4a16", torch.float32, "fp32"), ("linear_w4a16", torch.bfloat16, "bf16"),
                                           ("linear_fp8", torch.bfloat16, "bf16"),
                                           ("attention", torch.bfloat16, "bf16"), ("attention", torch.float32, "fp32")])
def test_compute_rows_are_judged_against_their_dtypes_peak(op, dtype, want, peaks):
    """A compute-bound row's ceiling is the register-only peak probe of the dtype of its
    arithmetic (``OpSpec.compute_dtype``), timed in the row's loop, not an fp32 matmul: int8 dot
    products against VPDPBUSD, bf16 against VDPBF16PS, fp32 against FMAs (AMX where present; the
    FMA peak where this CPU has no instruction for the dtype)."""
    spec = tessera.OPS[op]
    if op == "attention":
        g = torch.Generator().manual_seed(0)
        kw = {k: torch.randn(1, 64, 2, 32, generator=g).to(dtype) for k in ("q", "k", "v")}
        kw.update(causal=False)
    else:
        kw = _peer_kwargs(op, 64, dtype, torch.Generator().manual_seed(7))[0]  # M = 64: the GEMM path
    case = dataclasses.replace(spec.bench_cases[0], name="tiny")
    plan = runner.Plan(spec, case, dtype, "fwd", ("cpu",))
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1, peaks=peaks), 10.0)
    assert row["bound"] == "compute" and row["roof"]["dtype"] == want, row["roof"]
    assert f"({peaks['by_dtype'][want]['probe']})" in row["roof"]["kind"] and row["roof"]["rate"] > 0
    assert row["roof"]["spread"] is not None
    assert row["pct_roofline"]["tessera-cpu"] == pytest.approx(100 * row["gflops"]["tessera-cpu"] / row["roof"]["rate"])
    assert f"GFLOP/s {want}" in report.table([row])


def test_compute_peaks_per_dtype_say_when_an_instruction_is_missing():
    pk = runner.roofline.compute_peaks(repeats=2, iters=200_000)
    flags = tessera.backends.cpu.cpu_flags()
    assert pk["fp32_fma"]["gflops"] > 0
    for name, flag in (("bf16_dpbf16", "avx512_bf16"), ("int8_vnni", "avx512_vnni"), ("bf16_amx", "amx_bf16"),
                       ("int8_amx", "amx_int8")):
        present = flag in flags or (name == "int8_vnni" and "avx_vnni" in flags)
        assert (isinstance(pk[name], dict) and pk[name]["gflops"] > 0) if present else pk[name] == "not present", name
    assert set(pk["by_dtype"]) == {"fp32", "bf16", "int8"}
    # bf16 can always run as fp32 FMAs: its ceiling is never below the FMA peak
    assert pk["by_dtype"]["bf16"]["gflops"] >= pk["by_dtype"]["fp32"]["gflops"]


def _row(ms, pct=None, roof_spread=0.05, spread=0.02, **extra):
    row = {"op": "x", "case": "c", "dtype": "fp32", "dir": "fwd", "shape": "1", "bytes": 10**9, "bound": "memory",
           "ms": ms, "spread": {k: spread for k in ms}, "roof": {"kind": "NT copy GB/s", "rate": 100.0,
                                                                  "spread": roof_spread}, "layout_roof": None}
    row.update(extra)
    return report.finish_row(row, 10.0)


def test_rows_over_their_ceiling_beyond_noise_are_flagged():
    """1 GB at 100 GB/s takes 10 ms: 9.5 ms (105%) is within 5% + 2% noise, 8 ms (125%) is not."""
    assert not [f for f in _row({"tessera-cpu": 9.5})["flags"] if f.startswith("over ceiling")]
    row = _row({"tessera-cpu": 8.0})
    assert any(f.startswith("over ceiling: tessera-cpu 125%") for f in row["flags"]), row["flags"]
    assert any("over ceiling" in ln for ln in report.findings([row]))


def test_rows_a_baseline_wins_are_stated():
    """dequant+matmul (the weight dequantized once, then F.linear) faster than tessera: stated."""
    row = _row({"tessera-cpu": 2.0, "eager": 5.0, "dequant+matmul": 1.0, "torch-int8pack": 3.0})
    assert "dequant+matmul wins (0.50x)" in row["flags"] and not any("int8pack" in f for f in row["flags"])
    assert any("dequant+matmul wins" in ln for ln in report.findings([row]))


def test_read_rows_rotate_past_the_llc_and_small_rows_say_cache_resident(monkeypatch):
    """A read-bound row whose bytes fit the LLC cycles through copies of its inputs (each call reads
    other memory) and its read ceiling too; a memory row that fits and is not rotated is marked."""
    # a 32 MiB LLC whatever this VM reports (one seen here reports its host's 480 MiB L3, which
    # the 64-copy rotation cap cannot exceed twice with a small row)
    monkeypatch.setattr(runner.roofline, "llc_bytes", lambda: 32 << 20)
    silu = tessera.OPS["silu"]
    built, seen = set(), set()

    def peer(kw):
        x = kw["x"]
        built.add(x.data_ptr())
        return lambda: seen.add(x.data_ptr()) or torch.nn.functional.silu(x)

    tess = set()

    def fn(x, backend=None):   # tessera's contender, recording each copy it was called on
        tess.add(x.data_ptr())
        return silu.fn(x, backend=backend)

    spec = dataclasses.replace(silu, name="silu_rot_test", bound="read", peers={"p": peer}, fn=fn)
    kw = runner.make_inputs(spec, silu.bench_cases[0], torch.float32, torch.device("cpu"), scale=0.01)
    nbytes = spec.bytes_fwd(kw)
    rot = runner.roofline.rotation(nbytes)
    assert nbytes < runner.roofline.llc_bytes() and rot * nbytes >= 2 * runner.roofline.llc_bytes()
    plan = runner.Plan(spec, silu.bench_cases[0], torch.float32, "fwd", ("cpu",))
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1), 10.0)
    assert row["rotated"] == rot and len(built) == rot and len(seen) > 1 and not row["cache_resident"]
    # tessera was called on every copy before timing (per-weight state such as the vendor
    # route's dequantized weight is built on a first call), though 3 repeats reach only a few
    assert rot > 8 and len(tess) == rot
    assert row["roof"]["spread"] is not None
    plan = runner.Plan(silu, silu.bench_cases[0], torch.float32, "fwd", ("cpu",))
    row = report.finish_row(runner.measure(plan, 3, torch.device("cpu"), kw, warmup=1), 10.0)
    assert row["rotated"] == 1 and row["cache_resident"] and "(cache)" in report.table([row])
    assert any("cache-resident rows" in ln for ln in report.findings([row]))


def test_rotation_stays_within_memory(monkeypatch):
    """Copies for a big LLC are capped by available memory (each contender derives its own state
    from every copy: a VM reporting a 480 MiB L3 once had the bench OOM-killed), never below one."""
    assert 0 < runner.roofline.mem_available() < 1 << 50       # this machine's /proc/meminfo
    monkeypatch.setattr(runner.roofline, "llc_bytes", lambda: 480 << 20)
    monkeypatch.setattr(runner.roofline, "mem_available", lambda: 24 << 30)
    nbytes = 22 << 20
    rot = runner.roofline.rotation(nbytes)
    assert rot * nbytes <= (24 << 30) * runner.roofline.ROTATION_MEM_FRACTION and rot == 17
    monkeypatch.setattr(runner.roofline, "mem_available", lambda: 256 << 30)
    assert runner.roofline.rotation(nbytes) == 44                # 2 x LLC / nbytes, rounded up
    assert runner.roofline.rotation(1 << 20) == 64               # the copy-count cap
    monkeypatch.setattr(runner.roofline, "mem_available", lambda: 1 << 20)
    assert runner.roofline.rotation(nbytes) == 1


def _ceiling_row(monkeypatch, fast_every: int, fast_s: float):
    # the probe's duration is virtual: it advances the clock the timer reads instead of sleeping, so
    # a loaded machine (a sleep that overshoots by milliseconds) cannot move the statistics
    calls, offset = [0], [0.0]

    def probe():
        calls[0] += 1
        offset[0] += fast_s if calls[0] % fast_every == 0 else 0.008

    class _Clock:
        @staticmethod
        def perf_counter():
            return time.perf_counter() + offset[0]

    monkeypatch.setattr(timing, "time", _Clock)
    monkeypatch.setattr(runner.roofline, "ceiling_callable",
                        lambda kind, nbytes, device, rotate=1: (probe, 1e9, "NT copy GB/s"))
    silu = tessera.OPS["silu"]
    plan = runner.Plan(silu, silu.bench_cases[0], torch.float32, "fwd", ("cpu",))
    kw = runner.make_inputs(silu, silu.bench_cases[0], torch.float32, torch.device("cpu"), scale=0.01)
    return report.finish_row(runner.measure(plan, 8, torch.device("cpu"), kw, warmup=1), 10.0)


def test_a_rows_ceiling_is_its_fast_quartile_with_its_spread(monkeypatch):
    """A bandwidth ceiling is the fast quartile of its interleaved samples: where one call in three
    is fast (2 ms, the rest 8 ms; a median would say 8 ms) the row takes a fast-side rate and reports
    the spread; a single outlier (one call in eight at 0.5 ms) does not set the denominator, as the
    best sample alone did (it moved committed ceilings by up to 2x)."""
    row = _ceiling_row(monkeypatch, 3, 0.002)
    assert 1e9 / 0.005 / 1e9 < row["roof"]["rate"] <= 1e9 / 0.002 / 1e9, row["roof"]
    assert row["roof"]["spread"] > 0.5 and "+-" in report.table([row])
    row = _ceiling_row(monkeypatch, 8, 0.0005)
    assert row["roof"]["rate"] < 1e9 / 0.004 / 1e9, row["roof"]


def test_overhead_table_lists_each_op_against_eager(tmp_path):
    """`python -m tessera.bench.overhead`: every op asked for gets a row with tessera's and eager's
    per-call time and their ratio, written to overhead.md / overhead.json."""
    import json as _json

    from tessera.bench import overhead
    assert overhead.main(["--op", "silu,int_mm", "--calls", "5", "--repeats", "3", "--out", str(tmp_path)]) == 0
    rows = _json.loads((tmp_path / "overhead.json").read_text())["rows"]
    assert [r["op"] for r in rows] == ["silu", "int_mm"]
    for r in rows:
        assert r["us"]["tessera-cpu"] > 0 and r["us"]["eager"] > 0, r
    md = (tmp_path / "overhead.md").read_text()
    assert "| silu |" in md and "| int_mm |" in md and "cpu / eager" in md
