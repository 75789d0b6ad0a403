"""``tessera bench --models`` (tessera.bench.models) on the tiny configs: every row exists with
positive figures, and the patched models' logits agree with the unpatched ones.

The section proper runs each measurement in a fresh child process; here the rows are measured
in-process (``in_process=True``: ~30 s instead of a child's ~6 s import per row), and one child
checks the subprocess path and its peak-memory figure.
"""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tessera  # noqa: E402
from tessera import cli  # noqa: E402
from tessera.bench import models  # noqa: E402


@pytest.fixture(scope="module")
def tiny_report():
    return models.run("tiny", compile=False, in_process=True, log=lambda s: None)


def test_rows_exist_and_are_positive(tiny_report):
    rows = tiny_report["rows"]
    got = {(r["model"], r["phase"], r["batch"], r["contender"], r["cache"]) for r in rows}
    for c in ("eager", "tessera"):
        assert ("llama-tiny", "train", 2, c, "-") in got and ("bert-tiny", "train", 2, c, "-") in got
    for c in ("eager", "tessera", "tessera+w4a8"):
        assert ("bert-tiny", "forward", 2, c, "-") in got
    assert ("llama-tiny", "prefill", 1, "eager", "DynamicCache fp32") in got
    for b in (1, 8):
        assert ("llama-tiny", "decode", b, "eager", "DynamicCache fp32") in got
        for cache in ("bf16 pages", "int8 pages"):
            assert ("llama-tiny", "decode", b, "tessera", cache) in got
        assert ("llama-tiny", "decode", b, "tessera+w4a8", "int8 pages") in got
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["median_s"] > 0, r
        if r["phase"] == "train":
            assert r["peak_mib"] >= 0 and r["first_loss"] > 0
    skipped = {(s["model"], s["contender"], s["phase"]) for s in tiny_report["skipped"]}
    assert ("llama-tiny", "compile", "train") in skipped            # compile=False here
    assert ("llama-tiny", "tessera+w4a8", "train") in skipped
    assert tiny_report["models"]["llama-tiny"]["parameters"] > 0
    md = models.table(tiny_report)
    assert md.startswith("| model |") and "llama-tiny" in md and "bert-tiny" in md and "Not run:" in md


def test_patched_logits_match_unpatched(tiny_report):
    """Whole-sequence logits of each tiny model, tessera.patch against transformers (fp32), and the
    section's own record of the same comparison (last-position logits after prefill / forward)."""
    for name, (family, kw) in models.CONFIGS["tiny"].items():
        model = models.build(family, kw)
        ids, _ = models._inputs(family, kw, 2, 24, 7)
        with torch.no_grad():
            ref = model(input_ids=ids).logits
            with tessera.patched(model):
                out = model(input_ids=ids).logits
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    for r in tiny_report["rows"]:
        if r["contender"] == "tessera" and "max_abs_diff_vs_eager" in r:
            assert r["max_abs_diff_vs_eager"] < 1e-4 * max(1.0, r["ref_max_abs"]), r
        if r["contender"] == "tessera+w4a8" and "max_abs_diff_vs_eager" in r:   # int4 weights: close, not equal
            assert r["max_abs_diff_vs_eager"] < 0.5 * r["ref_max_abs"] + 1, r
    # greedy decode on bf16 / int8 pages from the same prompt: same length per row
    dec = [r for r in tiny_report["rows"] if r["phase"] == "decode"]
    assert all(len(r["greedy_tokens"]) == models.SHAPES["tiny"]["new"] for r in dec)


def test_child_process_measures_peak():
    """The real path: one training step measurement in a fresh child, with its RSS peak."""
    env_skipped: list = []
    r = models._spawn("tiny", "llama-tiny", "tessera", "train", None, 300, env_skipped, print)
    assert not env_skipped, env_skipped
    assert r["tokens_per_s"] > 0 and r["peak_mib"] > 0 and r["maxrss_mib"] > 100


def test_cli_models_writes_json_and_table(tmp_path, capsys, monkeypatch, tiny_report):
    calls = []
    monkeypatch.setattr(models, "run", lambda size, **kw: calls.append((size, kw)) or tiny_report)
    out = tmp_path / "m"
    assert cli.main(["bench", "--models", "--tiny", "--no-compile", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| model |" in text and "llama-tiny" in text
    rep = json.loads((out / "bench.json").read_text())
    assert rep["section"] == "models" and rep["command"][:3] == ["tessera", "bench", "--models"]
    assert calls[0][0] == "tiny" and calls[0][1]["compile"] is False
    assert len(rep["models"]["rows"]) > 10
    assert (out / "table.md").read_text().startswith("| model |")
