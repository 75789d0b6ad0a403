"""Benchmark report: derived figures, the stdout table, ``bench.json`` and ``bench.png``.

Derived per row (all from medians measured in the same run):

* ``gbps``          -- ``bytes / median time`` (bytes from the op's roofline model:
  the bytes that must cross DRAM, read + written; 1 GB = 1e9 bytes);
* ``gflops``        -- compute-bound ops (``OpSpec.bound == "compute"``): FLOPs / median time;
* ``pct_roofline``  -- the rate / the row's own ceiling (``row["roof"]``: the fast quartile of the
  interleaved samples of an NT copy of the same bytes (memory rows) or of a read pass over them, rotated past
  the LLC (read rows); for compute rows the register-only peak of the row's arithmetic dtype,
  ``OpSpec.compute_dtype``, timed likewise), with the ceiling's spread (p90 - p10) / median;
* ``flags``         -- ``over ceiling``: a tessera rate above 100% of its ceiling by more than
  the noise the row reports (its own IQR spread + the ceiling's spread: a broken ceiling or
  byte/FLOP model, never a result); ``cache-resident``: the row's bytes stay in the LLC between
  calls (a warm-cache number); ``<peer> wins``: a peer or baseline (e.g. dequant+matmul: the
  weight dequantized once, then F.linear) is faster than tessera in this row;
* ``pct_layout``    -- rows of ops with ``OpSpec.layout_read`` (paged decode): the rate / that
  of a plain read of the same bytes in the op's own layout (its scattered pages), timed in
  the row's loop: what the memory system gives for the layout, where ``pct_roofline`` is
  against one linear buffer;
* ``speedup``       -- eager time / tessera time and compile time / tessera time, and the
  same for every peer of the row (``OpSpec.peers``) (> 1 means tessera is faster).
"""
from __future__ import annotations

import importlib.metadata
import os
import platform

_FLAG_PREFIXES = ("avx512", "amx")
_FLAGS = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "neon", "asimd", "sve", "sve2"}


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "tessera": _version("tessera"),
            "triton": _version("triton"), "numpy": _version("numpy"), "matplotlib": _version("matplotlib")}


def machine_info() -> dict:
    """CPU model, ISA level chosen by the cpu backend, flags of interest, compiler, threads, memory."""
    from ..backends import cpu
    info: dict = {"machine": platform.machine(), "cores": os.cpu_count()}
    try:
        info.update(cpu.describe())
    except ValueError as e:  # an invalid TESSERA_CPU_ISA: say so instead of crashing `info`
        info["isa_error"] = str(e)
        info["isas_supported"] = cpu.supported_isas()
    info["flags"] = sorted(f for f in cpu.cpu_flags() if f in _FLAGS or f.startswith(_FLAG_PREFIXES))
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            kb = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")), 0)
        info["mem_gib"] = round(kb / 2**20, 1)
    except OSError:
        pass
    return info


# ----------------------------------------------------------------------------- derived figures

def finish_row(row: dict, roof_gbps: float) -> dict:
    """Rates and % of ceiling.  The ceiling is the row's own (timed in its loop); the run's
    start-of-run copy rate ``roof_gbps`` is only the fallback where a row has none."""
    ms = row["ms"]
    row["gbps"] = {k: (row["bytes"] / (v * 1e-3) / 1e9 if v else None) for k, v in ms.items()}
    if row.get("bound") == "compute":
        row["gflops"] = {k: (row["flops"] / (v * 1e-3) / 1e9 if v else None) for k, v in ms.items()}
        rates = row["gflops"]
    else:
        rates = row["gbps"]
    roof = (row.get("roof") or {}).get("rate") or (roof_gbps if row.get("bound") != "compute" else None)
    row["pct_roofline"] = {k: (100.0 * g / roof if (g and roof) else None) for k, g in rates.items()}
    lay = (row.get("layout_roof") or {}).get("rate")
    row["pct_layout"] = {k: (100.0 * g / lay if (g and lay) else None) for k, g in row["gbps"].items()}
    row["speedup"] = {}
    for k, v in ms.items():
        if k.startswith("tessera-") and v:
            row["speedup"][k] = {b: (ms[b] / v if ms.get(b) else None) for b in ms if not b.startswith("tessera-")}
    flags = row["flags"] = []
    if row.get("cache_resident"):
        flags.append("cache-resident")
    noise = ((row.get("roof") or {}).get("spread") or 0.0)
    for k, pct in row["pct_roofline"].items():
        own = (row.get("spread") or {}).get(k) or 0.0
        if k.startswith("tessera-") and pct and pct > 100.0 * (1.0 + noise + own):
            flags.append(f"over ceiling: {k} {pct:.0f}% (noise {100 * (noise + own):.0f}%)")
    for k, sp in row["speedup"].items():
        flags += [f"{b} wins ({x:.2f}x)" for b, x in sp.items() if b not in ("eager", "compile") and x and x < 1.0]
    return row


def findings(rows: list[dict]) -> list[str]:
    """The lines after the table: rows over their ceiling, rows a peer/baseline wins, cache rows."""
    out = []
    for r in rows:
        for f in r.get("flags", []):
            if f != "cache-resident":
                out.append(f"{r['op']} {r['case']} {r['dtype']} {r['dir']}: {f}")
    cached = [f"{r['op']} {r['case']} {r['dtype']} {r['dir']}" for r in rows if r.get("cache_resident")]
    if cached:
        out.append(f"cache-resident rows (bytes fit the LLC, warm between calls): {', '.join(cached)}")
    return out


def _f(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _rate(row: dict, k: str) -> str:
    if row.get("bound") == "compute":
        return f"{_f(row['gflops'][k], '.1f')} GFLOP/s"
    return f"{_f(row['gbps'][k], '.1f')} GB/s"


def _roof(row: dict) -> str:
    r = row.get("roof")
    if not r:
        return "-"
    unit = {"compute": f"GFLOP/s {r.get('dtype', '')}".rstrip(), "read": "GB/s rd"}.get(row.get("bound"), "GB/s")
    sp = f" +-{100 * r['spread']:.0f}%" if r.get("spread") is not None else ""
    return f"{r['rate']:.1f} {unit}{sp}" + (" (cache)" if row.get("cache_resident") else "")


def progress_line(i: int, n: int, row: dict) -> str:
    parts = []
    for k, v in row["ms"].items():
        label = k.replace("tessera-", "")
        extra = ""
        if k.startswith("tessera-") and v:
            lay = row.get("pct_layout", {}).get(k)
            extra = (f" ({_rate(row, k)}, {_f(row['pct_roofline'][k], '.0f')}%"
                     + (f", {lay:.0f}% of the layout read" if lay else "") + ")")
        parts.append(f"{label} {_f(v, '.3f', 'ERR')} ms{extra}")
    return f"[{i}/{n}] {row['op']} {row['case']} ({row['shape']}) {row['dtype']} {row['dir']}: " + " | ".join(parts)


def table(rows: list[dict]) -> str:
    head = ["op", "case", "shape", "dtype", "dir", "backend", "tessera ms", "eager ms", "compile ms",
            "rate", "roof", "%roof", "%layout", "eager %roof", "compile %roof", "x eager", "x compile", "x peers"]
    lines = []
    for r in rows:
        for k, v in r["ms"].items():
            if not k.startswith("tessera-"):
                continue
            sp = r["speedup"].get(k, {})
            lines.append([r["op"], r["case"], r["shape"], r["dtype"], r["dir"], k[len("tessera-"):], _f(v, ".3f", "ERR"),
                          _f(r["ms"].get("eager"), ".3f", "ERR"), _f(r["ms"].get("compile"), ".3f", "ERR" if "compile" in r["ms"] else "-"),
                          _rate(r, k), _roof(r), _f(r["pct_roofline"][k], ".0f"),
                          _f(r.get("pct_layout", {}).get(k), ".0f"),
                          _f(r["pct_roofline"].get("eager"), ".0f"), _f(r["pct_roofline"].get("compile"), ".0f"),
                          _f(sp.get("eager"), ".2f"), _f(sp.get("compile"), ".2f"),
                          " ".join(f"{b} {_f(x, '.2f')}" for b, x in sp.items() if b not in ("eager", "compile")) or "-"])
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i < 6 or i == len(head) - 1 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(ln) for ln in lines])


def header(report: dict) -> str:
    roof, mm, m = report["roofline"], report["matmul"], report["machine"]
    lines = [f"machine: {m.get('cpu', '?')} | isa {m.get('isa', '?')} | {m.get('threads')} threads | "
             f"malloc tuning: {'on' if report['mode']['malloc_tuning'] else 'off'}"]
    pk = report.get("peaks")
    if pk:
        def one(k):
            v = pk.get(k)
            return (f"{k} {v['gflops']} +-{100 * (v['spread'] or 0):.0f}%" if isinstance(v, dict) else f"{k} {v}")
        lines.append("compute peaks (register-only loops, every thread, best of "
                     f"{pk['repeats']}; GFLOP/s, int8 GOP/s): " + ", ".join(one(k) for k in
                     ("fp32_fma", "bf16_dpbf16", "int8_vnni", "bf16_amx", "int8_amx")) +
                     "; compute rows use: " + ", ".join(f"{d} -> {v['probe']}" for d, v in pk["by_dtype"].items()))
    if roof.get("roofline") == "nt_copy":
        lines.append(f"roofline = NT-store C copy over {roof['buffer_mib']} MiB, {roof['threads']} threads, bytes read+written: "
                     f"{roof['nt_copy_gbps']:.2f} GB/s (plain-store copy {roof['plain_copy_gbps']:.2f}, "
                     f"torch copy_ {roof['torch_copy_gbps']:.2f}); read-only pass (the ceiling of bound='read' "
                     f"rows, bytes read): {roof['read_gbps']:.2f} GB/s")
    else:
        lines.append(f"roofline = torch copy_ on {report['device']}: {roof['gbps']:.2f} GB/s")
    mm_s = ", ".join(f"{k.replace('_gflops', '')} {v} GFLOP/s" for k, v in mm.items()
                     if k.endswith("_gflops") and k != "fma_peak_gflops")
    lines.append(f"torch.matmul {mm['n']}^3 (for comparison): {mm_s}")
    for o in report["overhead"]:
        us = ", ".join(f"{k} {v if isinstance(v, str) else format(v, '.1f') + ' us'}" for k, v in o["us"].items())
        lines.append(f"per-call overhead {o['op']} {o['shapes']} {o['dtype']}: {us}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plot

def plot(report: dict, path: str) -> None:
    """Bars of % of roofline per op x dtype: tessera backend(s) / eager / compile, fwd and bwd."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    if not ops:
        ops, dtypes = ["(no rows)"], [""]
    names = list(dict.fromkeys(k for r in rows for k in r["ms"]))
    colors = {"eager": "#9e9e9e", "compile": "#f0a030"}
    palette = ["#1f5fbf", "#2e9e4f", "#8e44ad"]
    fig, axes = plt.subplots(len(ops), len(dtypes), figsize=(4.8 * len(dtypes) + 1, 3.2 * len(ops) + 0.6),
                             squeeze=False)
    for i, op in enumerate(ops):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dt]
            width = 0.8 / max(1, len(names))
            for k, name in enumerate(names):
                vals = [r["pct_roofline"].get(name) or 0.0 for r in sel]
                xs = [x + (k - (len(names) - 1) / 2) * width for x in range(len(sel))]
                c = colors.get(name) or palette[k % len(palette)]
                ax.bar(xs, vals, width, label=name.replace("tessera-", "tessera "), color=c)
            ax.axhline(100, color="k", lw=0.8, ls="--")
            ax.set_xticks(range(len(sel)))
            ax.set_xticklabels([(r["case"] if r["case"] == r["shape"] else f"{r['case']}\n{r['shape']}")
                                + f"\n{r['dir']}" for r in sel], fontsize=7)
            for x, r in enumerate(sel):  # speedup of each tessera backend vs eager / compile
                label = "\n".join((f"{k[len('tessera-'):]} " if len(r["speedup"]) > 1 else "")
                                   + f"{_f(sp.get('eager'), '.1f')}x / {_f(sp.get('compile'), '.1f')}x"
                                   for k, sp in r["speedup"].items())
                if label:
                    top = max([v for v in r["pct_roofline"].values() if v] or [0])
                    ax.text(x, top + 2, label, ha="center", va="bottom", fontsize=6)
            ax.set_ylabel("% of roofline")
            ax.set_title(f"{op} {dt}", fontsize=10)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    roof = report["roofline"]
    fig.suptitle(f"tessera bench: % of each row's ceiling (NT copy / read pass of its bytes, or its dtype's peak), "
                 f"{roof['threads']} threads; labels: speedup vs eager / vs compile (per backend)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
