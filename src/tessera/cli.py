"""``tessera`` command line: ``info``, ``check``, ``bench``.

* ``tessera info``  -- what this machine offers: backends, CPU ISA level and
  flags, compiler, threads, triton (version, interpreter, GPU), OpenCL (platforms,
  devices, OpenCL C versions, extensions, unified memory, the selected device and its
  zero-copy probe), registered ops and their dtypes per backend.  ``--json`` for machines.
* ``tessera check`` -- the correctness matrix (:mod:`tessera.testing.matrix`) as a
  table op x backend x dtype; exit status 1 on any failure.
* ``tessera bench`` -- the benchmark (:mod:`tessera.bench`): tessera vs PyTorch
  eager vs torch.compile on the memory roofline, table + ``bench.json`` +
  ``bench.png``.  ``tessera bench --models`` runs the model-level section instead
  (:mod:`tessera.bench.models`: whole HF models, random init; ~7 min on 2 cores with ``--threads 1``).

Everything is generated from ``tessera.OPS``: a newly registered op shows up in
all three commands without touching this file.

Two things must happen before anything imports triton or allocates, so they
are done first in :func:`main`: ``check --backend triton`` on a machine without
a GPU sets ``TRITON_INTERPRET=1`` (the interpreter), and ``bench`` re-executes
itself once with glibc malloc tuned to keep freed big blocks (see ``--help``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

from .bench import MALLOC_ENV, malloc_tuned

_DTYPES = {"fp32": "float32", "float32": "float32", "f32": "float32", "fp16": "float16", "float16": "float16",
           "half": "float16", "f16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "int8": "int8", "int16": "int16"}  # integer-only ops (requantize, conv2d_int8): their x / output dtype


def _split(values) -> list[str]:
    """Flatten repeated and comma-separated option values: --op a,b --op c -> [a, b, c]."""
    return [v.strip() for item in (values or []) for v in item.split(",") if v.strip()]


def _dtypes(parser, values, default):
    import torch
    names = _split(values) or default
    out = []
    for n in names:
        if n.lower() not in _DTYPES:
            parser.error(f"argument --dtype: unknown dtype {n!r}; expected one of fp32, fp16, bf16, int8, int16")
        out.append(getattr(torch, _DTYPES[n.lower()]))
    return out


def _backends(parser, values) -> list[str]:
    from ._registry import BACKENDS
    names = _split(values)
    for n in names:
        if n not in BACKENDS:
            parser.error(f"argument --backend: unknown backend {n!r}; expected one of {', '.join(BACKENDS)}")
    return names


def _ops(parser, values) -> list[str] | None:
    from . import OPS
    names = _split(values)
    for n in names:
        if n not in OPS:
            parser.error(f"argument --op: unknown op {n!r}; registered: {', '.join(sorted(OPS)) or '(none)'}")
    return names or None


def _dt(d) -> str:
    return {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(d), str(d))


# ----------------------------------------------------------------------------- info

def cmd_info(args) -> int:
    import torch

    from . import OPS, __version__
    from ._registry import BACKENDS, backend_available, kernel_module
    from .backends import cross
    from .backends import opencl as ocl
    from .backends import triton as tr
    from .bench.report import machine_info, versions

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    info = {"tessera": __version__, "versions": versions(), "machine": machine_info(), "backends": {},
            "triton": tr.describe(), "opencl": ocl.describe(), "cross": cross.describe(), "ops": {}}
    info["triton"]["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for dev in devices:
        for b in BACKENDS:
            ok, why = backend_available(b, dev)
            info["backends"][f"{b}@{dev.type}"] = {"available": ok, "reason": why}
    for name, spec in sorted(OPS.items()):
        per = {}
        for b in spec.kernels:
            try:
                per[b] = [_dt(d) for d in kernel_module(spec, b).DTYPES]
            except Exception as e:  # a kernel module that cannot even import is worth showing
                per[b] = f"import failed: {type(e).__name__}: {e}"
        info["ops"][name] = {"dtypes": per, "cases": len(spec.cases),
                             "bench_cases": [c.name for c in spec.bench_cases]}
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    m, v, t = info["machine"], info["versions"], info["triton"]
    print(f"tessera {__version__}  (torch {v['torch']}, python {v['python']})")
    print(f"cpu: {m.get('cpu', '?')} ({m['machine']}, {m['cores']} cores, {m.get('mem_gib', '?')} GiB)")
    print(f"  isa level: {m.get('isa', m.get('isa_error'))}   supported: {', '.join(m['isas_supported'])}")
    print(f"  flags: {' '.join(m['flags']) or '(none of interest)'}")
    print(f"  compiler: {m.get('compiler')}   threads: {m.get('threads')}")
    print(f"triton: {'installed ' + t.get('version', '') if t['installed'] else 'not installed'}   "
          f"interpreter: {'on' if t['interpreter'] else 'off'}   GPU: {t['gpu'] or 'none'}")
    _print_opencl(info["opencl"])
    for name, c in info["cross"].items():   # edge CPUs: kernels in a runner under qemu or on a board
        print(f"{name}: {c['compiler']} + {c['remote'] or c['emulator']}"
              + (f" (RVV VLEN {c['rvv_vlen']})" if "rvv_vlen" in c else "")
              + ("" if c["available"] else f"   unavailable: {c['reason']}"))
    print("backends:")
    for key, st in info["backends"].items():
        print(f"  {key:<16} {'available' if st['available'] else 'unavailable: ' + st['reason']}")
    print(f"ops ({len(info['ops'])}):")
    for name, o in info["ops"].items():
        per = " | ".join(f"{b}: {' '.join(d) if isinstance(d, list) else d}" for b, d in o["dtypes"].items())
        print(f"  {name:<14} {per}   ({o['cases']} cases, bench: {', '.join(o['bench_cases']) or '-'})")
    return 0


def _print_opencl(o: dict) -> None:
    """The opencl section of `tessera info`: platforms, devices, the features kernels use, selection."""
    if not o["installed"]:
        print("opencl: pyopencl not installed (pip install 'tessera[opencl]')")
        return
    print(f"opencl: pyopencl {o['pyopencl']}   {len(o['platforms'])} platform(s), {len(o['devices'])} device(s)"
          + (f"   TESSERA_OPENCL_DEVICE={o['env']!r}" if o["env"] else ""))
    for p in o["platforms"]:
        print(f"  platform {p['index']}: {p['name']} ({p['vendor']}) {p['version']}")
        for d in o["devices"]:
            if not d["label"].startswith(f"{p['index']}:"):
                continue
            mark = "*" if d["label"] == o["selected"] else " "
            feats = ", ".join(f"{k.replace('_', ' ')} {'yes' if v else 'no'}" for k, v in d["features"].items())
            um = {True: "yes", False: "no", None: "unknown"}[d["unified_memory"]]
            print(f"   {mark}[{d['index']}] {d['label']}  ({d['type']}, {d['compute_units']} CUs, "
                  f"{d['global_mem_mib']} MiB, max work-group {d['max_work_group_size']})")
            print(f"        {d['opencl_c']} | {d['version']} | driver {d['driver']}")
            print(f"        extensions used when present: {feats} | unified memory: {um} | "
                  f"{len(d['extensions'])} extensions: {' '.join(d['extensions'])}")
    if o["selected"] is None:
        print(f"  selected: none ({o['why_not']})")
        return
    zc = o.get("zero_copy")
    zc = ("yes (kernels read and write the tensors' own memory)" if zc is True else
          "no (each launch maps its written buffers back: a copy)" if zc is False else zc)
    print(f"  selected: {o['selected']}   zero-copy probe: {zc}   fp16 arithmetic: "
          f"{'on' if o.get('fp16_arithmetic') else 'off (storage only)'}   portable mode: {'on' if o['portable'] else 'off'}")
    if isinstance(o.get("paths"), dict):   # which path each extension feature takes in the kernels
        words = {"device": "extension", "emulated": "emulated (TESSERA_OPENCL_EMULATE, tests)", "portable": "portable"}
        print("  kernel paths: " + ", ".join(f"{k.replace('_', ' ')}: {words.get(v, v)}" for k, v in o["paths"].items()))


# ----------------------------------------------------------------------------- check

def _prepare_triton(requested: list[str]) -> tuple[list[str], list[str]]:
    """Pick the backends to check; switch triton to the interpreter when asked for without a GPU."""
    import torch

    from ._registry import BACKENDS
    from .backends import triton as tr
    notes = []
    gpu = torch.cuda.is_available()
    if "triton" in requested and not gpu and not tr.interpreted():
        if "triton" in sys.modules:
            notes.append("triton was imported before TRITON_INTERPRET=1 could be set: the interpreter may not "
                         "take effect (run `tessera check --backend triton` in a fresh process)")
        os.environ["TRITON_INTERPRET"] = "1"
    if requested:
        backends = requested
    else:
        backends = [b for b in BACKENDS if b != "triton" or gpu or tr.interpreted()]
        if "triton" not in backends:
            notes.append("triton skipped: no GPU here; `--backend triton` runs it through the interpreter (slow)")
    if "triton" in backends and not gpu:
        notes.append("triton runs through the interpreter (TRITON_INTERPRET=1) on CPU tensors; "
                     "cases tagged 'large' are skipped for it")
    return backends, notes


def cmd_check(args, parser) -> int:
    backends, notes = _prepare_triton(_backends(parser, args.backend))
    import torch

    from .backends import triton as tr
    from .testing.matrix import cells, run_case
    ops = _ops(parser, args.op)
    dtypes = _dtypes(parser, args.dtype, []) if args.dtype else None
    for n in notes:
        print(f"note: {n}")
    groups: dict[tuple, dict] = {}
    failures = []
    cur, t0 = None, time.time()
    # triton checks run on the GPU when there is one (CUDA tensors), else on CPU tensors through the
    # interpreter; every other backend runs on CPU tensors
    gpu = torch.cuda.is_available() and not tr.interpreted()
    todo = itertools.chain.from_iterable(
        cells(backends=(b,), ops=ops, include_large=not args.no_large,
              device="cuda" if b == "triton" and gpu else "cpu") for b in backends)
    for spec, b, dt, case in todo:
        if dtypes is not None and dt not in dtypes:
            continue
        if b == "triton" and tr.interpreted() and "large" in case.tags:
            continue
        key = (spec.name, b, _dt(dt))
        if key != cur:
            if cur is not None:
                _progress(cur, groups[cur], t0)
            cur, t0 = key, time.time()
        g = groups.setdefault(key, {"passed": 0, "total": 0, "fwd": 0.0, "grad": 0.0})
        r = run_case(spec, b, dt, case, grads=not args.no_grad, device="cuda" if b == "triton" and gpu else "cpu")
        g["total"] += 1
        g["passed"] += r.ok
        g["fwd"], g["grad"] = max(g["fwd"], r.fwd_err), max(g["grad"], r.grad_err)
        if not r.ok:
            failures.append(f"{spec.name}/{b}/{_dt(dt)}/{case.name}: {r.why}")
    if cur is not None:
        _progress(cur, groups[cur], t0)
    if not groups:
        print("tessera check: nothing to run for this selection (see `tessera info`)")
        return 1
    head = ("op", "backend", "dtype", "passed", "max fwd err", "max grad err")
    lines = [(*k, f"{g['passed']}/{g['total']}", f"{g['fwd']:.3g}", f"{g['grad']:.3g}") for k, g in groups.items()]
    w = [max(len(h), *(len(ln[i]) for ln in lines)) for i, h in enumerate(head)]
    print()
    for ln in [head, tuple("-" * x for x in w)] + lines:
        print("  ".join(c.ljust(x) if i < 3 else c.rjust(x) for i, (c, x) in enumerate(zip(ln, w))))
    total = sum(g["total"] for g in groups.values())
    if failures:
        print(f"\n{len(failures)} of {total} cases FAILED:")
        for f in failures:
            print(f"  FAIL {f}")
        return 1
    print(f"\nall {total} cases passed (torch {torch.__version__})")
    return 0


def _progress(key, g, t0) -> None:
    mark = "ok" if g["passed"] == g["total"] else "FAIL"
    print(f"  {'/'.join(key):<28} {g['passed']}/{g['total']} {mark}  ({time.time() - t0:.1f} s)", flush=True)


# ----------------------------------------------------------------------------- bench

def _maybe_reexec(args) -> None:
    """Re-run this very command once with glibc keeping freed big blocks (same argv, same process slot).

    Without it every large output is a fresh mmap whose first touch page-faults
    (~75 ms per 128 MiB here), for tessera and the baselines alike.  Values the
    user already set are kept; the report records which mode ran.
    """
    if args.no_malloc_tuning or malloc_tuned() or os.environ.get("TESSERA_BENCH_REEXEC"):
        return
    env = dict(os.environ, TESSERA_BENCH_REEXEC="1")
    for k, v in MALLOC_ENV.items():
        env.setdefault(k, v)
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def cmd_bench_models(args, argv_list) -> int:
    """``tessera bench --models``: the model-level section alone (:mod:`tessera.bench.models`)."""
    from pathlib import Path

    from .bench import models
    from .bench.report import machine_info, versions
    size = "tiny" if args.tiny else "full"
    t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"tessera bench --models: {', '.join(models.CONFIGS[size])}, every contender in a fresh child process"
          + ("" if args.tiny else " (~7 min on 2 cores with --threads 1)"), flush=True)
    rep = models.run(size, compile=not args.no_compile, compile_timeout_s=args.compile_timeout, threads=args.threads)
    report = {"command": argv_list, "started": t0, "machine": machine_info(), "versions": versions(),
              "section": "models", "models": rep}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench.json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    md = models.table(rep)
    (out / "table.md").write_text(md + "\n")
    print()
    print(md)
    print(f"\nwrote {out / 'bench.json'} and {out / 'table.md'} in {rep['elapsed_s']} s")
    return 0


def cmd_bench(args, parser, argv_list) -> int:
    import torch

    from . import bench
    if args.models:
        clash = [f for f, v in (("--op", args.op), ("--dtype", args.dtype), ("--backend", args.backend),
                                ("--target", args.target), ("--quick", args.quick)) if v]
        if clash:
            parser.error(f"argument --models: runs the model-level section only; drop {', '.join(clash)}")
        return cmd_bench_models(args, argv_list)
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = args.shape_scale if args.shape_scale is not None else (0.004 if args.tiny else (0.25 if args.quick else 1.0))
    if not (0 < scale <= 1):
        parser.error(f"argument --shape-scale: {scale} must be in (0, 1]")
    repeats = args.repeats if args.repeats is not None else (5 if args.quick or args.tiny else 10)
    if repeats < 1:
        parser.error(f"argument --repeats: {repeats} must be >= 1")
    backends = _backends(parser, args.backend) or ["cpu"]
    try:
        bench.run(ops=_ops(parser, args.op), dtypes=_dtypes(parser, args.dtype, ["fp32", "bf16"]),
                  backends=backends, out_dir=args.out, repeats=repeats, quick=args.quick, shape_scale=scale,
                  tiny=args.tiny, extended=args.extended, command=argv_list, with_compile=not args.no_compile)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera", description="tessera: fused AI operators -- info, check, bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("info", help="backends, CPU ISA, triton, OpenCL devices and registered ops on this machine")
    i.add_argument("--json", action="store_true", help="print machine-readable JSON")
    c = sub.add_parser("check", help="run the correctness matrix; exit 1 on any failure")
    c.add_argument("--backend", action="append", help="backend(s), comma-separated (default: all that run here)")
    c.add_argument("--op", action="append", help="op(s), comma-separated (default: all)")
    c.add_argument("--dtype", action="append", help="dtype(s): fp32, fp16, bf16 (default: each op's)")
    c.add_argument("--no-large", action="store_true", help="skip cases tagged 'large'")
    c.add_argument("--no-grad", action="store_true", help="forward outputs only")
    b = sub.add_parser("bench", help="tessera vs eager vs torch.compile on the measured roofline")
    b.add_argument("--quick", action="store_true", help="1/4 of the rows of row-wise ops, fewer repeats (~4 min on 2 cores)")
    b.add_argument("--op", action="append", help="op(s), comma-separated (default: all registered)")
    b.add_argument("--dtype", action="append", help="dtype(s), comma-separated (default: fp32,bf16)")
    b.add_argument("--backend", action="append", help="tessera backend(s) to time (default: cpu)")
    b.add_argument("--out", default="bench-out", help="directory for bench.json and bench.png (default: bench-out)")
    b.add_argument("--extended", action="store_true",
                   help="also the long bench cases (tagged 'extended': e.g. attention batch 1-4 x seq 512-4096)")
    b.add_argument("--repeats", type=int, help="timed samples per contender (default 10, --quick 5)")
    b.add_argument("--threads", type=int, help="torch/OpenMP threads (default: torch's)")
    b.add_argument("--models", action="store_true",
                   help="instead of the per-op run: model-level figures (Llama-style ~125M decoder, BERT-style "
                        "encoder; random init): train step, prefill, decode tokens/s and training peak memory, "
                        "transformers eager / torch.compile / tessera.patch / + w4a8 "
                        "(~7 min on 2 cores with --threads 1); writes bench.json and table.md")
    b.add_argument("--compile-timeout", type=float, default=240,
                   help="--models: seconds allowed per torch.compile child (compilation included; default 240)")
    b.add_argument("--no-compile", action="store_true",
                   help="do not time torch.compile (its compilation dominates a short GPU session)")
    b.add_argument("--no-malloc-tuning", action="store_true",
                   help="do not re-exec with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_/MALLOC_TOP_PAD_ raised "
                        "(every big output then pays fresh page faults, baselines included)")
    b.add_argument("--target", choices=("aarch64", "riscv64"),
                   help="edge CPU: dynamic instructions per element under qemu, vector vs portable C "
                        "(emulated time means nothing)")
    b.add_argument("--shape-scale", type=float, help=argparse.SUPPRESS)  # tests: shrink the row dimension
    b.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests: tiny shapes and probes
    L = sub.add_parser("build", help="the edge-CPU kernels as a C library (static + shared, header, example)")
    L.add_argument("--target", required=True, choices=("x86_64", "aarch64", "riscv64"))
    L.add_argument("--out", required=True, help="output directory")
    return p


def cmd_build(args) -> int:
    from pathlib import Path

    from .backends import cross_lib
    try:
        files = cross_lib.build(args.target, Path(args.out))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point; pass ``argv`` to run in-process (tests: never re-execs)."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "info":
        return cmd_info(args)
    if args.cmd == "check":
        return cmd_check(args, parser)
    if args.cmd == "build":
        return cmd_build(args)
    if args.cmd == "bench" and args.target:
        from .bench import icount
        print(icount.report(args.target))
        return 0
    if argv is None and not args.models:   # --models: its children run on glibc's default malloc settings
        _maybe_reexec(args)
    return cmd_bench(args, parser, ["tessera", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
