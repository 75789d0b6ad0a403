"""``OpSpec.peers``: other libraries' kernels are timed beside eager/compile in forward rows,
a peer that cannot run records its reason, and the report derives a speedup for each."""
import dataclasses

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
