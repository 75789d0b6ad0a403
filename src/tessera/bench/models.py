"""Model-level figures for ``tessera bench --models``: whole Hugging Face models built from
configs with random weights (no hub download), unpatched transformers against tessera.

    tessera bench --models --threads 1         # the section alone (~7 min on 2 cores)
    python -m tessera.bench.models --threads 1 --out DIR   # the same, writes models.json / models.md

``--threads N`` sets torch's threads in every child.  On a shared machine use 1: with torch's
default threads and other jobs on the same cores, every parallel region waits for a descheduled
OpenMP thread, and small-M matmuls (decode) slow down by an order of magnitude (measured in
benchmarks/results/2026-12-04-cpu-models/README.md).

Models (``CONFIGS``): a Llama-style decoder (hidden 768, 12 layers, 12 heads / 4 KV heads,
SwiGLU 2048, vocab 32000, untied head: ~125M parameters) and a BERT-style encoder (BERT-base
widths, 6 layers: ~67M parameters with the MLM head; attention dropout 0 for every contender,
as tessera's attention has none).  The ``tiny`` size (tests) shrinks both
to seconds.  fp32 weights throughout (training in fp32 with AdamW as people run it on a CPU).

Figures, each for every contender that applies, all in one run:

* ``train``   -- one optimizer step: forward with labels (causal-LM loss / MLM loss), backward,
  ``AdamW.step()``, ``zero_grad(set_to_none=True)``; tokens/s = batch x seq / median step time;
  peak memory (below);
* ``prefill`` -- decoder: the prompt's forward into a fresh KV cache (``logits_to_keep=1``, as
  ``generate`` does); encoder: a plain forward; tokens/s = batch x seq / median time;
* ``decode``  -- decoder only: after an (untimed) prefill of a short prompt, ``new`` greedy
  one-token steps (``model(next_ids, past_key_values=cache)`` + argmax) at batch 1 and 8;
  tokens/s = batch x new / median time of the ``new`` steps.

Contenders: ``eager`` (unpatched transformers, sdpa attention, ``DynamicCache``), ``compile``
(``torch.compile`` of the unpatched model, default mode; its first call -- the compilation --
is excluded from the median and reported as ``first_step_s`` / ``first_s``; its prefill runs
with ``use_cache=False``), ``tessera`` (``tessera.patch``;
decode on ``tessera.paged_cache`` with bf16 or int8 pages; prefill on bf16 pages) and
``tessera+w4a8`` (``tessera.patch`` then ``tessera.quantize(model, "w4a8-g128")``: every
Linear whose in_features is a multiple of 128, the LM / MLM head included; decode on int8
pages only, the smallest configuration).  Warm-up: one call of the same shape for ``compile``
(its compilation), a short (8-token) call for the others; decode warms up with 2 steps.  Not run:
``compile`` for decode (``DynamicCache`` grows by one token a step: dynamic-shape
recompilation, and a ``StaticCache`` graph costs minutes of inductor time on 2 cores -- more
than this whole section's budget) and ``tessera+w4a8`` for training (QuantLinear weights are
frozen int4 buffers: there is nothing for AdamW to train).

Every (model, contender, phase) runs in a fresh child process (``python -m
tessera.bench.models --child ...``), so no allocator state or compiled code is shared.  Peak
memory of a training step is the child's resident-set high-water mark (``VmHWM`` from
``/proc/self/status``, after resetting it with ``/proc/self/clear_refs``; torch's CPU
allocations are plain malloc/mmap, invisible to ``tracemalloc``, and the CPU has no
``torch.cuda.max_memory_allocated``) minus the resident set just before the first step (the
model built, torch._dynamo imported): gradients + AdamW state + activations + workspaces
(+ the compiler's own memory for ``compile``, whose first step compiles).  ``peak_steady_mib``
resets the mark after the warm-up step: what a step adds once the optimizer state exists.
``maxrss_mib`` is ``getrusage(RUSAGE_SELF).ru_maxrss`` of the child (absolute, torch included).
The children run with glibc's default malloc settings (the per-op bench's
``MALLOC_*`` tuning is removed from their environment).  Linux only (``/proc``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# peak memory: the child's resident-set high-water mark, measured as the loss-memory bench does
from .loss_memory import _reset_peak, _status

LLAMA = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
BERT = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=6, num_attention_heads=12,
            vocab_size=30522, max_position_embeddings=512, attention_probs_dropout_prob=0.0)
TINY_LLAMA = dict(LLAMA, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
TINY_BERT = dict(BERT, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=256)

# name -> (family, config kwargs) per size
CONFIGS = {"full": {"llama-125m": ("llama", LLAMA), "bert-6l-67m": ("bert", BERT)},
           "tiny": {"llama-tiny": ("llama", TINY_LLAMA), "bert-tiny": ("bert", TINY_BERT)}}
# shapes and repetitions per size
SHAPES = {"full": dict(train_batch=2, train_seq=128, train_reps=3, prefill_batch=1, prefill_seq=256,
                       enc_batch=4, enc_seq=128, infer_reps=3, prompt=16, new=16, batches=(1, 8)),
          "tiny": dict(train_batch=2, train_seq=16, train_reps=2, prefill_batch=1, prefill_seq=32,
                       enc_batch=2, enc_seq=16, infer_reps=2, prompt=8, new=4, batches=(1, 8))}
CONTENDERS = ("eager", "compile", "tessera", "tessera+w4a8")
MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


# ----------------------------------------------------------------------------- child side

def build(family: str, kw: dict, seed: int = 0):
    """The model of ``family`` from config kwargs ``kw``, random init with ``seed`` (eval mode)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    else:
        model = transformers.BertForMaskedLM(transformers.BertConfig(**kw))
    return model.eval()


def _prepare(model, contender: str):
    """Apply the contender to ``model``; returns (model or its compiled callable, notes)."""
    import torch

    import tessera
    notes = {}
    if contender == "compile":
        return torch.compile(model), notes
    if contender in ("tessera", "tessera+w4a8"):
        tessera.patch(model)
        notes["patched"] = {k: v for k, v in model._tessera_counts.items() if v}
    if contender == "tessera+w4a8":
        tessera.quantize(model, "w4a8-g128")
        r = model.tessera_quant_report
        notes["quantized_layers"], notes["float_layers"] = len(r.replaced), [n for n, _ in r.skipped]
    return model, notes


def _inputs(family: str, kw: dict, batch: int, seq: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, kw["vocab_size"], (batch, seq), generator=g)
    if family == "llama":
        return ids, ids.clone()
    labels = torch.full_like(ids, -100)
    pick = torch.rand(batch, seq, generator=g) < 0.15
    pick[:, 0] = True
    labels[pick] = ids[pick]
    return ids, labels


def child_train(family: str, kw: dict, contender: str, sh: dict) -> dict:
    import torch
    import torch._dynamo  # noqa: F401  (the first custom-op call imports it: pay that before the baseline)
    model = build(family, kw).train()
    fn, notes = _prepare(model, contender)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, labels = _inputs(family, kw, sh["train_batch"], sh["train_seq"], 1)

    def step():
        loss = fn(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    reset = _reset_peak()
    base = _status("VmRSS") if reset else _status("VmHWM")
    t0 = time.perf_counter()
    first_loss = step()                       # warm-up (and compilation for ``compile``)
    first_s = time.perf_counter() - t0
    peak_first = _status("VmHWM") - base
    reset2 = _reset_peak()
    base2 = _status("VmRSS")
    times = []
    for _ in range(sh["train_reps"]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    tokens = sh["train_batch"] * sh["train_seq"]
    med = statistics.median(times)
    import resource
    return {"times_s": times, "median_s": med, "tokens_per_s": tokens / med, "first_step_s": first_s,
            "peak_mib": max(peak_first, _status("VmHWM") - base) / 2**20,
            "peak_steady_mib": (_status("VmHWM") - base2) / 2**20 if reset2 else None,
            "peak_reset": reset, "first_loss": first_loss,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "notes": notes,
            "shape": {"batch": sh["train_batch"], "seq": sh["train_seq"]}}


def _time(fn, reps: int) -> tuple[list[float], object]:
    out, times = None, []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def child_infer(family: str, kw: dict, contender: str, sh: dict) -> dict:
    """Prefill (decoder) / forward (encoder) and, for decoders, decode at each batch size."""
    import torch

    import tessera
    model = build(family, kw)
    res: dict = {"rows": []}
    if family == "llama":
        B, S = sh["prefill_batch"], sh["prefill_seq"]
    else:
        B, S = sh["enc_batch"], sh["enc_seq"]
    ids, _ = _inputs(family, kw, B, S, 2)
    patched = contender.startswith("tessera")
    with torch.no_grad():
        ref = model(input_ids=ids).logits[:, -1:] if family == "llama" else model(input_ids=ids).logits
    fn, notes = _prepare(model, contender)
    res["notes"] = notes

    def cache(batch_dtype=None, tokens=None):
        if not patched:
            return None
        return tessera.paged_cache(model, max_tokens=tokens, dtype=batch_dtype)

    with torch.no_grad():
        if family == "llama":
            def prefill():
                return fn(input_ids=ids, past_key_values=cache(torch.bfloat16, S) if patched else None,
                          use_cache=contender != "compile", logits_to_keep=1).logits
        else:
            def prefill():
                return fn(input_ids=ids).logits
        t0 = time.perf_counter()
        if contender == "compile":
            prefill()                              # warm-up = compilation (same shape: dynamic=False)
        else:                                      # warm-up on a short input (first-call costs only)
            full, ids = ids, ids[:, :8]
            prefill()
            ids = full
        first = time.perf_counter() - t0
        times, out = _time(prefill, sh["infer_reps"])
        diff = float((out.float() - ref.float()).abs().max())
        med = statistics.median(times)
        what = "prefill" if family == "llama" else "forward"
        kv = ("bf16 pages" if patched else "DynamicCache fp32" if contender != "compile" else "-") \
            if family == "llama" else "-"
        res["rows"].append({"phase": what, "batch": B, "tokens": S, "cache": kv,
                            "times_s": times, "median_s": med, "tokens_per_s": B * S / med, "first_s": first,
                            "max_abs_diff_vs_eager": diff, "ref_max_abs": float(ref.abs().max())})
        if family != "llama" or contender == "compile":
            return res
        P, N = sh["prompt"], sh["new"]
        dtypes = {"eager": (None,), "tessera": (torch.bfloat16, torch.int8), "tessera+w4a8": (torch.int8,)}[contender]
        for batch in sh["batches"]:
            prompt, _ = _inputs(family, kw, batch, P, 3)
            for dt in dtypes:
                def setup():
                    c = cache(dt, P + N + 1)
                    o = fn(input_ids=prompt, past_key_values=c, use_cache=True)
                    return o.past_key_values, o.logits[:, -1].argmax(-1, keepdim=True)

                def decode(state, n=N):
                    c, nxt = state
                    toks = []
                    for _ in range(n):
                        o = fn(input_ids=nxt, past_key_values=c, use_cache=True)
                        nxt = o.logits[:, -1].argmax(-1, keepdim=True)
                        toks.append(nxt)
                    return torch.cat(toks, 1)

                decode(setup(), 2)                # warm-up
                times, toks = [], None
                for _ in range(sh["infer_reps"]):
                    st = setup()
                    t0 = time.perf_counter()
                    toks = decode(st)
                    times.append(time.perf_counter() - t0)
                med = statistics.median(times)
                res["rows"].append({"phase": "decode", "batch": batch, "tokens": N, "prompt": P,
                                    "cache": "DynamicCache fp32" if dt is None else
                                    {torch.bfloat16: "bf16 pages", torch.int8: "int8 pages"}[dt],
                                    "times_s": times, "median_s": med, "tokens_per_s": batch * N / med,
                                    "greedy_tokens": toks[0].tolist()})
    return res


# ----------------------------------------------------------------------------- parent side

def _plan(size: str) -> list[tuple[str, str, str]]:
    todo = []
    for name, (family, _) in CONFIGS[size].items():
        for c in ("eager", "tessera", "compile"):
            todo.append((name, c, "train"))
        for c in CONTENDERS:
            todo.append((name, c, "infer"))
    return todo


def _child_cmd(size, name, contender, phase, threads=None):
    return [sys.executable, "-m", "tessera.bench.models", "--child", name, "--size", size,
            "--contender", contender, "--phase", phase] + (["--threads", str(threads)] if threads else [])


def _spawn(size, name, contender, phase, env, timeout_s, skipped, log, threads=None):
    """One measurement in a fresh child process; its result dict, or None (recorded in ``skipped``)."""
    try:
        p = subprocess.run(_child_cmd(size, name, contender, phase, threads), capture_output=True, text=True, env=env,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        skipped.append({"model": name, "contender": contender, "phase": phase,
                        "why": f"timed out after {timeout_s:.0f} s (the limit per child)"})
        log(f"  {name} {contender} {phase}: timed out after {timeout_s:.0f} s")
        return None
    if p.returncode != 0:
        err = (p.stderr or p.stdout)[-1500:]
        skipped.append({"model": name, "contender": contender, "phase": phase, "why": f"failed: {err}"})
        log(f"  {name} {contender} {phase}: FAILED (exit {p.returncode})\n{err}")
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(size: str = "full", *, compile: bool = True, log=print, timeout_s: float = 600,
        compile_timeout_s: float | None = None, in_process: bool = False, threads: int | None = None) -> dict:
    """Run every (model, contender, phase) in a fresh child; returns {"models", "rows", "skipped", ...}.

    ``in_process`` (tests) measures in this process instead: the times stand, the peaks do not
    (other allocations share the high-water mark).  ``compile_timeout_s`` bounds the children of
    ``compile`` (a timeout is a skip with its reason)."""
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARS}
    rows, skipped = [], []
    for name, (family, kw) in CONFIGS[size].items():
        skipped.append({"model": name, "contender": "tessera+w4a8", "phase": "train",
                        "why": "QuantLinear holds frozen int4 weights: nothing for AdamW to update"})
        if family == "llama":
            skipped.append({"model": name, "contender": "compile", "phase": "decode",
                            "why": "DynamicCache grows each step (dynamic-shape recompiles); a StaticCache "
                                   "graph takes minutes of inductor time on 2 cores, over this section's budget"})
    t_start = time.time()
    for name, contender, phase in _plan(size):
        if contender == "compile" and not compile:
            skipped.append({"model": name, "contender": contender, "phase": phase, "why": "--no-compile"})
            continue
        t0 = time.time()
        if in_process:
            family, kw = CONFIGS[size][name]
            r = (child_train if phase == "train" else child_infer)(family, kw, contender, SHAPES[size])
        else:
            limit = compile_timeout_s if contender == "compile" and compile_timeout_s else timeout_s
            r = _spawn(size, name, contender, phase, env, limit, skipped, log, threads)
            if r is None:
                continue
        family = CONFIGS[size][name][0]
        base = {"model": name, "family": family, "contender": contender, "notes": r.get("notes", {})}
        if phase == "train":
            rows.append(dict(base, phase="train", batch=r["shape"]["batch"], tokens=r["shape"]["seq"], cache="-",
                             **{k: r[k] for k in ("times_s", "median_s", "tokens_per_s", "first_step_s", "peak_mib",
                                                   "peak_steady_mib", "maxrss_mib", "first_loss")}))
        else:
            for x in r["rows"]:
                rows.append(dict(base, **x))
        log(f"  {name:12s} {contender:13s} {phase:6s} {time.time() - t0:6.1f} s  " + "  ".join(
            f"{x['phase']}" + (f"[b{x['batch']} {x['cache']}]" if x['phase'] == 'decode' else '')
            + f" {x['tokens_per_s']:.1f} tok/s" for x in rows if x["model"] == name and x["contender"] == contender
            and (x["phase"] == "train") == (phase == "train")))
    models = {}
    for name, (family, kw) in CONFIGS[size].items():
        m = build(family, kw)
        models[name] = {"family": family, "config": kw, "parameters": sum(p.numel() for p in m.parameters())}
        del m
    shapes = {k: list(v) if isinstance(v, tuple) else v for k, v in SHAPES[size].items()}
    return {"size": size, "threads": threads or "torch default", "shapes": shapes,
            "models": models, "rows": rows, "skipped": skipped, "elapsed_s": round(time.time() - t_start, 1),
            "method": "Every (model" + __doc__.split("Every (model", 1)[1].rstrip()}


def _speedup(rows, r) -> str:
    e = next((x for x in rows if x["model"] == r["model"] and x["contender"] == "eager" and x["phase"] == r["phase"]
              and x["batch"] == r["batch"]), None)
    return "-" if e is None or r["contender"] == "eager" else f"{r['tokens_per_s'] / e['tokens_per_s']:.2f}x"


def table(rep: dict) -> str:
    """Markdown: one line per (model, phase, batch, contender, cache); x eager = tokens/s over eager's."""
    head = ("model", "phase", "batch x tokens", "contender", "KV cache", "tokens/s", "x eager", "median s",
            "peak MiB (steady)", "note")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {c: i for i, c in enumerate(CONTENDERS)}
    phases = {"train": 0, "prefill": 1, "forward": 1, "decode": 2}
    rows = sorted(rep["rows"], key=lambda r: (list(rep["models"]).index(r["model"]), phases[r["phase"]], r["batch"],
                                              order[r["contender"]], r["cache"]))
    for r in rows:
        peak = "-"
        if r["phase"] == "train":
            peak = f"{r['peak_mib']:.0f} ({r['peak_steady_mib']:.0f})" if r.get("peak_steady_mib") is not None \
                else f"{r['peak_mib']:.0f}"
        note = []
        if r["contender"] == "compile":
            note.append(f"compile {r.get('first_step_s', r.get('first_s', 0)):.0f} s")
        if "max_abs_diff_vs_eager" in r and r["contender"] != "eager":
            note.append(f"max|dlogit| {r['max_abs_diff_vs_eager']:.2g}")
        out.append("| " + " | ".join([r["model"], r["phase"], f"{r['batch']} x {r['tokens']}", r["contender"],
                                      r["cache"], f"{r['tokens_per_s']:.1f}", _speedup(rep["rows"], r),
                                      f"{r['median_s']:.3f}", peak, "; ".join(note)]) + " |")
    if rep["skipped"]:
        out.append("")
        out.append("Not run: " + "; ".join(f"{s['model']} {s['contender']} {s['phase']} ({s['why'][:200]})"
                                          for s in rep["skipped"]))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.bench.models", description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(CONFIGS), default="full")
    ap.add_argument("--out", help="directory for models.json and models.md")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-timeout", type=float, default=240, help="seconds per compile child (default 240)")
    ap.add_argument("--threads", type=int, help="torch threads in each child (default: torch's)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=("train", "infer"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        if a.threads:
            import torch
            torch.set_num_threads(a.threads)
        family, kw = CONFIGS[a.size][a.child]
        fn = child_train if a.phase == "train" else child_infer
        print(json.dumps(fn(family, kw, a.contender, SHAPES[a.size])))
        return 0
    rep = run(a.size, compile=not a.no_compile, compile_timeout_s=a.compile_timeout, threads=a.threads)
    print(table(rep))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "models.json"), "w") as f:
            json.dump(rep, f, indent=1)
        with open(os.path.join(a.out, "models.md"), "w") as f:
            f.write(table(rep) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
