"""Peak memory and time of a training step's LM head + loss: ``tessera.fused_linear_cross_entropy``
against ``F.linear`` + ``F.cross_entropy`` (and ``F.linear`` + ``tessera.cross_entropy``).

    python -m tessera.bench.loss_memory          # 8192 tokens x 2048 hidden x 128256 vocab, fp32 (~20 min)
    python -m tessera.bench.loss_memory --quick  # 2048 x 1024 x 32000, 3 steps each (a few minutes)
    python -m tessera.bench.loss_memory --tokens 2048 --rounds 3 --contender eager --contender tessera-flce

Each contender runs in a fresh child process (no allocator state shared between them): the
child builds hidden (T, H) and weight (V, H) (both requiring grad) and the targets, then runs
``repeats`` x (forward + ``loss.backward()``), setting the gradients to None between steps.
Peak memory is the process's resident-set high-water mark (``VmHWM`` in ``/proc/self/status``,
which is what the kernel accounts for every allocator: torch's CPU allocations are plain
``malloc``/``mmap`` and invisible to ``tracemalloc``) minus the resident set just before the
first step, after the inputs exist and the peak was reset (``/proc/self/clear_refs`` = 5; where
the kernel refuses that, the baseline is the high-water mark so far, which the inputs set).  So
"peak" is what the step adds on top of its inputs: logits, their gradients, workspaces, and the
parameter gradients (dweight is V x H, the same for every contender).  Time is the median step
(fresh allocations page-fault on every step here, as in a training loop on this allocator);
``--rounds`` cycles through the contenders several times so that drifting machine load (a
shared 2-core VM) hits each alike.  Linux only (``/proc``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONTENDERS = ("tessera-flce", "eager", "tessera-ce")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(name: str, T: int, H: int, V: int, dtype: str, repeats: int, backend: str) -> dict:
    import torch
    import torch.nn.functional as F

    import tessera
    dt = getattr(torch, DTYPES[dtype])
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, H, generator=g).to(dt).requires_grad_(True)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5).to(dt).requires_grad_(True)
    target = torch.randint(0, V, (T,), generator=g)
    target[::7] = -100  # some ignored positions (prompt tokens / padding)

    def step(hidden, weight, target):
        if name == "tessera-flce":
            loss = tessera.fused_linear_cross_entropy(hidden, weight, target, backend=backend)
        elif name == "tessera-ce":
            loss = tessera.cross_entropy(F.linear(hidden, weight), target, backend=backend)
        else:
            loss = F.cross_entropy(F.linear(hidden, weight), target)
        loss.backward()
        return loss

    # one tiny step first: builds (or loads) the native kernels, and pays the one-off costs of the
    # first call (the first custom-op dispatch imports torch._dynamo: ~140 MB of resident memory)
    step(*(t.detach()[:3, :8].clone().requires_grad_(True) for t in (hidden, weight)), torch.tensor([0, 1, 2]))
    reset = _reset_peak()
    base = _status("VmRSS") if reset else _status("VmHWM")
    times, loss = [], None
    for _ in range(repeats):
        hidden.grad = weight.grad = None
        t0 = time.perf_counter()
        loss = step(hidden, weight, target)
        times.append(time.perf_counter() - t0)
    peak = _status("VmHWM") - base
    return {"name": name, "peak_bytes": peak, "peak_reset": reset, "times_s": times, "loss": float(loss),
            "grad_hidden_norm": float(hidden.grad.double().norm()),
            "grad_weight_norm": float(weight.grad.double().norm()),
            "threads": torch.get_num_threads()}


def run(T: int, H: int, V: int, dtype: str, repeats: int, backend: str, contenders, rounds: int = 1,
        log=print) -> dict:
    """``rounds`` cycles through the contenders (a fresh child each time), so a machine whose load
    drifts during minutes-long steps slows every contender alike; per contender the report keeps
    every step's time (the median is quoted) and the largest peak."""
    rows, merged = [], {}
    for rnd in range(rounds):
        for name in contenders:
            cmd = [sys.executable, "-m", "tessera.bench.loss_memory", "--child", name, "--tokens", str(T), "--hidden",
                   str(H), "--vocab", str(V), "--dtype", dtype, "--repeats", str(repeats), "--backend", backend]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                rows.append({"name": name, "round": rnd, "error": (p.stderr or p.stdout)[-2000:]})
                log(f"{name}: failed (exit {p.returncode})\n{rows[-1]['error']}")
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["round"] = rnd
            rows.append(r)
            m = merged.setdefault(name, {"peak_bytes": 0, "times_s": []})
            m["peak_bytes"] = max(m["peak_bytes"], r["peak_bytes"])
            m["times_s"] += r["times_s"]
            log(f"{name:14s} peak {r['peak_bytes'] / 2**30:7.2f} GiB   step {statistics.median(r['times_s']):8.2f} s   "
                f"loss {r['loss']:.6f}   |dh| {r['grad_hidden_norm']:.6g}   |dW| {r['grad_weight_norm']:.6g}")
    summary = {}
    if "tessera-flce" in merged and "eager" in merged:
        f, e = merged["tessera-flce"], merged["eager"]
        summary = {"peak_ratio_eager_over_flce": e["peak_bytes"] / max(f["peak_bytes"], 1),
                   "time_ratio_flce_over_eager": statistics.median(f["times_s"]) / statistics.median(e["times_s"])}
        log(f"peak: eager / tessera = {summary['peak_ratio_eager_over_flce']:.2f}x   "
            f"time (median step): tessera / eager = {summary['time_ratio_flce_over_eager']:.3f}x")
    return {"shape": {"tokens": T, "hidden": H, "vocab": V, "dtype": dtype}, "repeats": repeats, "rounds": rounds,
            "backend": backend, "rows": rows, "per_contender": merged, "summary": summary,
            "method": "VmHWM - VmRSS before the first step (peak reset via clear_refs), fresh child per contender"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.bench.loss_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--repeats", type=int, default=1, help="steps per child (default 1)")
    ap.add_argument("--rounds", type=int, default=1, help="cycles over the contenders, a fresh child each (default 1)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--quick", action="store_true", help="2048 tokens x 1024 hidden x 32000 vocab, 3 repeats")
    ap.add_argument("--contender", action="append", choices=CONTENDERS, help="default: all")
    ap.add_argument("--out", help="write the JSON report here")
    ap.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.tokens, a.hidden, a.vocab, a.repeats = 2048, 1024, 32000, max(a.repeats, 3)
    if a.child:
        print(json.dumps(child(a.child, a.tokens, a.hidden, a.vocab, a.dtype, a.repeats, a.backend)))
        return 0
    print(f"# {a.tokens} tokens x {a.hidden} hidden x {a.vocab} vocab, {a.dtype}, {a.repeats} step(s) per child, "
          f"{a.rounds} round(s), backend {a.backend}, {os.cpu_count()} CPUs")
    rep = run(a.tokens, a.hidden, a.vocab, a.dtype, a.repeats, a.backend, a.contender or CONTENDERS, a.rounds)
    rep["command"] = " ".join(["python -m tessera.bench.loss_memory"] + (argv if argv is not None else sys.argv[1:]))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
