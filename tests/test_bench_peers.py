"""``OpSpec.peers``: other libraries' kernels are timed beside eager/compile in forward rows,
a peer that cannot run records its reason, and the report derives a speedup for each."""
import dataclasses
import time

import torch

import tessera
from tessera.bench import report, runner


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
