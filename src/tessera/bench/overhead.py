"""Per-call overhead of every op on its tiniest input, alone (issue #16 item 4).

``python -m tessera.bench.overhead [--out DIR] [--backend cpu] [--calls 200] [--repeats 15]``

The same measurement as the overhead lines of ``tessera bench`` (:func:`runner.overhead`: the
op's smallest plain test case, tessera's public call against the op's plain-PyTorch formula
and a no-op ``torch.library.custom_op``, median us per call of samples of ``--calls`` calls,
interleaved), for every registered op, without the bandwidth rows around it: a table of
tessera / eager per op, printed and written to ``DIR/overhead.md`` and ``DIR/overhead.json``
with the machine and the command.  Eager's "equivalent op" is the spec's ``eager`` formula
(``F.silu``, ``F.rms_norm``, ``torch._int_mm``, ``F.linear`` + ``F.cross_entropy``, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from .. import OPS
from . import report as rep
from . import runner


def measure(backends=("cpu",), calls: int = 200, repeats: int = 15, ops=None) -> list[dict]:
    rows = []
    for name in ops or sorted(OPS):
        o = runner.overhead(OPS[name], backends, torch.device("cpu"), calls=calls, repeats=repeats)
        if o is not None:
            rows.append(o)
    return rows


def table(rows: list[dict], backends) -> str:
    head = "| op | input | " + " | ".join(f"tessera-{b} us" for b in backends) + \
        " | eager us | no-op custom op us | " + " | ".join(f"{b} / eager" for b in backends) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for o in rows:
        us = o["us"]
        eager = us.get("eager")
        cells = [f"{us.get(f'tessera-{b}')}" for b in backends]
        ratios = [f"{us[f'tessera-{b}'] / eager:.2f}" if isinstance(us.get(f"tessera-{b}"), float)
                  and isinstance(eager, float) and eager else "-" for b in backends]
        lines.append(f"| {o['op']} | {o['shapes']} {o['dtype']} | " + " | ".join(cells) +
                     f" | {eager} | {us.get('noop_custom_op')} | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.bench.overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for overhead.md / overhead.json")
    ap.add_argument("--backend", default="cpu", help="tessera backend(s), comma-separated")
    ap.add_argument("--op", default=None, help="op(s), comma-separated (default: all)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    backends = tuple(a.backend.split(","))
    t0 = time.time()
    load0 = round(os.getloadavg()[0], 2)
    rows = measure(backends, a.calls, a.repeats, a.op.split(",") if a.op else None)
    md = table(rows, backends)
    info = {"command": ["python", "-m", "tessera.bench.overhead", *(argv if argv is not None else sys.argv[1:])],
            "machine": rep.machine_info(), "versions": rep.versions(), "threads": torch.get_num_threads(),
            "loadavg_before": load0, "loadavg_after": round(os.getloadavg()[0], 2), "seconds": round(time.time() - t0, 1), "rows": rows}
    print(f"CPU: {info['machine'].get('cpu')}, {torch.get_num_threads()} threads\n{md}")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "overhead.json").write_text(json.dumps(info, indent=1))
        (out / "overhead.md").write_text(f"`{' '.join(info['command'])}` ({info['seconds']} s; CPU "
                                         f"{info['machine'].get('cpu')}, {info['threads']} threads, 1-min load "
                                         f"{load0} before / {info['loadavg_after']} after)\n\n{md}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
