"""The ``tessera`` command line, run in-process through ``tessera.cli.main``.

``main(argv)`` never re-executes itself (only the console entry point does), so
these tests exercise the same code paths as ``tessera info|check|bench`` while
staying in the pytest process.  The bench test uses the hidden ``--tiny`` mode:
a few rows per shape and small probes, so it finishes in seconds.
"""
import json
import os

import pytest
import torch

import tessera
from tessera import cli
from tessera.bench import MALLOC_ENV, runner


def test_info_text_and_json(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "isa level" in out and "backends:" in out and "triton:" in out
    for name in tessera.OPS:  # every registered op is listed, whoever registered it
        assert name in out
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backends"]["reference@cpu"]["available"] is True
    assert info["machine"]["isa"] in info["machine"]["isas_supported"]
    assert info["ops"]["rms_norm"]["dtypes"]["cpu"] == ["fp32", "fp16", "bf16"]


def test_info_lists_opencl(capsys):
    """`tessera info` lists the OpenCL platforms and devices (OpenCL C version, the extensions the
    kernels use, unified memory), the selected device and its zero-copy probe; --json the same."""
    from tessera.backends import opencl
    assert cli.main(["info", "--json"]) == 0
    o = json.loads(capsys.readouterr().out)["opencl"]
    assert o["installed"] is opencl._importable()
    assert len(o["devices"]) == len(opencl.devices())
    for d in o["devices"]:
        assert d["opencl_c"].startswith("OpenCL C") and set(d["features"]) == {"fp16", "subgroups",
                                                                                 "integer_dot_product"}
        assert isinstance(d["extensions"], list) and d["unified_memory"] in (True, False, None)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "opencl:" in out
    if o["selected"] is None:
        pytest.skip(f"no OpenCL device here: {o['why_not']}")
    assert o["zero_copy"] in (True, False)
    assert f"selected: {o['selected']}" in out and "zero-copy probe:" in out
    for d in o["devices"]:
        assert d["label"] in out and d["opencl_c"] in out
    assert "fp16 no" in out or "fp16 yes" in out


def _opencl_op():
    from tessera._registry import native_backends
    ops = [n for n, s in sorted(tessera.OPS.items()) if "opencl" in s.kernels]
    if "opencl" not in native_backends() or not ops:
        pytest.skip("no OpenCL device or no opencl kernel here")
    return "rms_norm" if "rms_norm" in ops else ops[0]


def test_check_opencl(capsys):
    op = _opencl_op()
    rc = cli.main(["check", "--backend", "opencl", "--op", op, "--dtype", "fp32", "--no-large"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert any(ln.split()[:3] == [op, "opencl", "fp32"] for ln in out.splitlines()), out


def test_check_reference_passes(capsys):
    rc = cli.main(["check", "--backend", "reference", "--op", "rms_norm"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "max fwd err" in out and "max grad err" in out
    n = len(tessera.OPS["rms_norm"].cases)
    for dt in ("fp32", "fp16", "bf16"):
        assert any(ln.split()[:3] == ["rms_norm", "reference", dt] and f"{n}/{n}" in ln for ln in out.splitlines())
    assert "all " in out and "passed" in out


def test_check_fails_on_a_broken_kernel(capsys, monkeypatch):
    import tessera.ops.rms_norm.ref as ref_kernels
    good = ref_kernels.forward

    def off_by_a_bit(x, weight, residual, eps):
        y, h, rstd = good(x, weight, residual, eps)
        return y * 1.01, h, rstd

    monkeypatch.setattr(ref_kernels, "forward", off_by_a_bit)
    rc = cli.main(["check", "--backend", "reference", "--op", "rms_norm", "--dtype", "fp32", "--no-grad"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL rms_norm/reference/fp32/" in out and "FAILED" in out


def test_check_drops_large_cases(capsys):
    assert cli.main(["check", "--backend", "reference", "--op", "rms_norm", "--dtype", "bf16", "--no-large",
                     "--no-grad"]) == 0
    spec = tessera.OPS["rms_norm"]
    n = sum("large" not in c.tags for c in spec.cases)
    assert f"{n}/{n}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, what", [
    (["check", "--op", "no_such_op"], "--op"),
    (["check", "--dtype", "fp8"], "--dtype"),
    (["bench", "--backend", "gpu"], "--backend"),
    (["bench", "--repeats", "0", "--tiny", "--op", "rms_norm"], "--repeats"),
])
def test_bad_arguments_name_the_option(argv, what, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert what in capsys.readouterr().err


def _bench_backends() -> list[str]:
    """cpu, and opencl beside it where a device is found: one bench run checks the report's rows,
    ceilings and speedups for every backend (a third contender included)."""
    from tessera._registry import native_backends
    return ["cpu"] + (["opencl"] if "opencl" in native_backends() and "opencl" in tessera.OPS["rms_norm"].kernels
                      else [])


def test_bench_tiny_writes_json_and_png(tmp_path, capsys):
    out_dir = tmp_path / "b"
    backends = _bench_backends()
    mine = {f"tessera-{b}" for b in backends}
    rc = cli.main(["bench", "--quick", "--tiny", "--op", "rms_norm", "--dtype", "fp32", "--repeats", "2",
                   "--backend", ",".join(backends), "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert rc == 0, out
    spec = tessera.OPS["rms_norm"]
    n_rows = 2 * len(spec.bench_cases)  # fwd + bwd per bench case, one dtype
    assert f"[{n_rows}/{n_rows}]" in out and "x compile" in out and "roofline" in out
    rep = json.loads((out_dir / "bench.json").read_text())
    assert rep["command"][:2] == ["tessera", "bench"]
    assert rep["mode"]["malloc_tuning"] in (True, False) and rep["mode"]["tiny"] is True
    assert rep["roofline"]["roofline"] == "nt_copy" and rep["roofline"]["gbps"] > 0 and rep["roofline"]["read_gbps"] > 0
    assert rep["roofline"]["torch_copy_gbps"] > 0 and rep["matmul"]["float32_gflops"] > 0
    pk = rep["peaks"]  # register-only peaks per dtype; each compute row's ceiling is one of them
    # (0.3, not 1: both are timed minutes apart on a shared 2-core VM; a FLOP count off by 4x fails)
    assert pk["fp32_fma"]["gflops"] > rep["matmul"]["float32_gflops"] * 0.3
    assert set(pk["by_dtype"]) == {"fp32", "bf16", "int8"} and all(v["gflops"] > 0 for v in pk["by_dtype"].values())
    assert all(pk[k] == "not present" or pk[k]["gflops"] > 0 for k in ("bf16_dpbf16", "int8_vnni", "bf16_amx", "int8_amx"))
    assert rep["overhead"][0]["op"] == "rms_norm"
    assert set(rep["overhead"][0]["us"]) == mine | {"eager", "noop_custom_op"}
    assert len(rep["rows"]) == n_rows and rep["mode"]["backends"] == backends
    for row in rep["rows"]:
        assert row["errors"] == {}, row["errors"]
        assert set(row["ms"]) == mine | {"eager", "compile"}
        assert all(v > 0 for v in row["ms"].values())
        assert row["roof"]["rate"] > 0 and row["roof"]["spread"] is not None  # the ceiling and its spread
        for b in mine:
            assert row["bytes"] > 0 and row["pct_roofline"][b] > 0
            assert row["speedup"][b]["eager"] > 0
    assert {r["dir"] for r in rep["rows"]} == {"fwd", "bwd"}
    table = out.split("x peers", 1)[1]  # the table: one line per row and backend
    for b in backends:
        assert sum(ln.split()[:1] == ["rms_norm"] and b in ln.split() for ln in table.splitlines()) == n_rows
    png = (out_dir / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_shape_scale_cuts_rows_only():
    spec = tessera.OPS["rms_norm"]
    case = next(c for c in spec.bench_cases if c.name.endswith("+res"))
    kw = runner.make_inputs(spec, case, torch.float32, torch.device("cpu"), scale=0.25)
    rows, n = kw["x"].shape[0], kw["x"].shape[-1]
    assert kw["residual"].shape == kw["x"].shape and kw["weight"].shape == (n,)
    assert kw["x"].is_contiguous() and rows == round(8192 * 0.25)


def test_bench_reexecs_once_with_malloc_tuning(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    for k in MALLOC_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("TESSERA_BENCH_REEXEC", raising=False)
    args = cli.build_parser().parse_args(["bench", "--quick"])
    cli._maybe_reexec(args)
    assert len(calls) == 1
    _, argv, env = calls[0]
    assert all(env[k] == v for k, v in MALLOC_ENV.items()) and env["TESSERA_BENCH_REEXEC"] == "1"
    # never twice, and never when asked not to
    monkeypatch.setenv("TESSERA_BENCH_REEXEC", "1")
    cli._maybe_reexec(args)
    monkeypatch.delenv("TESSERA_BENCH_REEXEC")
    cli._maybe_reexec(cli.build_parser().parse_args(["bench", "--no-malloc-tuning"]))
    assert len(calls) == 1


_TRIM_CHILD = """
import torch
from tessera.bench import release_freed_memory
def rss():
    return int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmRSS")).split()[1]) << 10
ts = [torch.ones(2 << 20) for _ in range(64)]     # 64 x 8 MiB, every page touched
del ts[::2]                                        # 256 MiB of holes the tuned heap keeps
before = rss()
release_freed_memory()
print((before - rss()) >> 20)
"""


def _glibc_with_proc() -> bool:
    import ctypes
    return os.path.exists("/proc/self/status") and hasattr(ctypes.CDLL(None), "malloc_trim")


@pytest.mark.skipif(not _glibc_with_proc(), reason="malloc_trim and /proc/self/status: glibc on Linux only")
def test_bench_gives_freed_heap_back_between_cases():
    """Under MALLOC_ENV a freed block stays resident (a full run grew to 10 GiB by row 168);
    release_freed_memory, called before every new case, must hand its pages back."""
    import subprocess
    import sys
    env = {**os.environ, **MALLOC_ENV}
    out = subprocess.run([sys.executable, "-c", _TRIM_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) >= 200, out.stdout


def test_quick_shape_scale_shrinks_only_row_ops():
    """--quick cuts the row dimension of row-wise ops; ops with index/sequence structure (paged
    caches, block tables, seq_lens) would become inconsistent, so they keep their shapes."""
    def shapes(name, scale):
        spec = tessera.OPS[name]
        case = next(c for c in spec.cases if not c.tags)
        kw = runner.make_inputs(spec, case, torch.float32, torch.device("cpu"), scale)
        return {k: tuple(v.shape) for k, v in kw.items() if isinstance(v, torch.Tensor)}

    full, half = shapes("rms_norm", 1.0), shapes("rms_norm", 0.5)
    assert half["x"][0] == max(1, round(full["x"][0] * 0.5)) and half["weight"] == full["weight"]
    assert shapes("decode_attention", 0.5) == shapes("decode_attention", 1.0)
