"""Whole-model CNN benchmark: ResNet-18 and MobileNetV2, fp32 and statically quantized.

    .venv/bin/python -m tessera.bench.cnn_models [--res 224] [--n 256] [--n-recal 64] [--batches 1,8] [--out DIR]

Models: ``tessera.testing.cnn_models`` (torchvision's architectures and initialisation, random
weights; torchvision's PyPI wheels are CUDA builds that do not load against the CPU torch).
Three settings, because a random network is not a trained one:

* ``default``: torchvision's initialisation as is (BatchNorm running stats mean 0 / var 1).  The
  network is well conditioned (40 dB of input noise gives >= 40 dB of logit SQNR) but its
  predictions hardly depend on the input (a handful of distinct top-1 classes over all inputs);
* ``bn-recal``: BatchNorm statistics set from 4 batches of random data
  (``bn_recalibrate``): the predictions depend on the input, but the random network amplifies
  any perturbation (the noise row: logit SQNR of the fp32 model for 40 dB of input noise);
* ``trained``: the network (10 classes) trained for ``--steps`` SGD steps on
  ``TemplateTask`` (a synthetic 10-class task at ``--task-res``, noisy shifted templates, no
  download; ``tessera.testing.cnn_models``), calibrated and evaluated on fresh samples of the
  task.  Its decisions depend on the input with the margins of a trained classifier, so its
  agreement figure is the one that says what quantization costs; the task accuracy of every
  contender is reported beside it.

Quality (``--n`` random N(0, 1) inputs at ``--res``, 224x224; ``--n-recal`` of them for the
bn-recal setting, to keep the run near 10 minutes: MobileNetV2's quantized depthwise convolutions
take ~0.35 s an image; ``--n`` fresh task samples for the trained setting): top-1 agreement
with the fp32 eager model
and logit SQNR = 20 log10(|y_fp32| / |y_fp32 - y|) in dB, for the tessera fp32 model
(``fold_batchnorm``: BN folded, ``tessera.nn.Conv2d``; fed channels-last, as its NHWC kernels
want -- on NCHW input ``auto`` dispatch hands every fp32 conv to oneDNN instead; the conversion
of the input is inside the timing), ``fp32 eager channels-last``
(the eager model and input in channels-last, oneDNN's own best layout), ``int8-static``, ``a16w8-static``
(calibrated on 4 batches of 8 random inputs) and ONNX Runtime fp32 (CPUExecutionProvider, the
model exported with torch.onnx's TorchScript exporter) if onnxruntime is installed.
Threads: ``--threads`` (default 1) for torch, tessera's kernels and ORT alike.
Latency (``--batches``, at ``--lat-res``, 224x224 by default): median of interleaved samples
(tessera.bench.timing, one untimed warm-up call each), default setting.  The VM is shared: the
1-minute load average before and after the run is recorded (over 2 means other processes ran).
Writes table.md, results.json and README.md under ``--out``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tessera.testing.cnn_models import TemplateTask

DEFAULT_OUT = "benchmarks/results/2026-12-04-cpu-cnn-quant"
CONTENDERS = ("fp32 eager", "fp32 eager channels-last", "tessera fp32", "int8-static", "a16w8-static", "ORT fp32")


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except Exception:  # noqa: BLE001
        return platform.processor()


def sqnr(ref, out) -> float:
    return float(20 * torch.log10(ref.norm() / (ref - out).norm()))


def _ort_session(model, res):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, res, res),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = torch.get_num_threads(), 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(sess.run(None, {"x": x.numpy()})[0])


def build(name, setting, res, gen, task=None, steps=250):
    """The fp32 model of ``setting``, its contenders and their setup times (plus training's)."""
    import tessera
    from tessera.testing.cnn_models import bn_recalibrate, mobilenet_v2, resnet18, train_on_task

    torch.manual_seed(0)
    classes = task.classes if setting == "trained" else 1000
    model = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2}[name](num_classes=classes).eval()
    setup = {}
    if setting == "bn-recal":
        bn_recalibrate(model, [torch.randn(8, 3, res, res, generator=gen) for _ in range(4)])
    if setting == "trained":
        t = time.perf_counter()
        losses = train_on_task(model, task, steps)
        setup["train"] = {"s": time.perf_counter() - t, "steps": steps, "final_loss": sum(losses[-10:]) / 10}
        cal = [task.sample(8, gen)[0] for _ in range(4)]
    else:
        cal = [torch.randn(8, 3, res, res, generator=gen) for _ in range(4)]
    cl = torch.channels_last
    eager_cl = copy.deepcopy(model).to(memory_format=cl)
    folded = tessera.fold_batchnorm(copy.deepcopy(model)).to(memory_format=cl)
    runs = {"fp32 eager": model,
            "fp32 eager channels-last": lambda x, m=eager_cl: m(x.contiguous(memory_format=cl)),
            "tessera fp32": lambda x, m=folded: m(x.contiguous(memory_format=cl))}
    for recipe in ("int8-static", "a16w8-static"):
        t = time.perf_counter()
        runs[recipe] = tessera.quantize(model, recipe, calibration=cal)
        setup[recipe] = time.perf_counter() - t
    ort = _ort_session(model, res)
    if ort is not None:
        runs["ORT fp32"] = ort
    return model, runs, setup


@torch.no_grad()
def quality(model, runs, x, chunk, labels=None):
    ys = {k: [] for k in runs}
    for i in range(0, x.shape[0], chunk):
        xb = x[i:i + chunk]
        for k, f in runs.items():
            ys[k].append(f(xb))
    ys = {k: torch.cat(v) for k, v in ys.items()}
    ref = ys["fp32 eager"]
    out = {"distinct_top1_fp32": int(ref.argmax(1).unique().numel())}
    sigma = 0.01 * float(x.std())        # 40 dB under the input's power
    noisy = torch.cat([model(x[i:i + chunk] + sigma * torch.randn_like(x[i:i + chunk]))
                       for i in range(0, x.shape[0], chunk)])
    out["fp32_input_noise_40dB_sqnr"] = sqnr(ref, noisy)
    for k, y in ys.items():
        if k != "fp32 eager":
            out[k] = {"top1_agreement": float((y.argmax(1) == ref.argmax(1)).float().mean()), "sqnr_db": sqnr(ref, y)}
    if labels is not None:    # the trained setting: task accuracy of every contender
        out["task_accuracy"] = {k: float((y.argmax(1) == labels).float().mean()) for k, y in ys.items()}
    return out


@torch.no_grad()
def latency(runs, res, batch, gen, budget_s):
    from tessera.bench.timing import time_interleaved
    x = torch.randn(batch, 3, res, res, generator=gen)
    fns = {k: (lambda f=f: f(x)) for k, f in runs.items()}
    t = time_interleaved(fns, repeats=7, warmup=1, min_sample_s=0.0, inner=1, budget_s=budget_s, min_repeats=3)
    return {k: {"median_ms": v.median * 1e3 if v.median else None, "samples": len(v.samples), "error": v.error}
            for k, v in t.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--res", type=int, default=224, help="resolution of the quality pass")
    p.add_argument("--n-recal", type=int, default=64, help="inputs of the quality pass, bn-recal setting")
    p.add_argument("--lat-res", type=int, default=224, help="resolution of the latency pass")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--chunk", type=int, default=16, help="batch size of the quality pass")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--models", default="resnet18,mobilenet_v2")
    p.add_argument("--settings", default="default,bn-recal,trained")
    p.add_argument("--task-res", type=int, default=64, help="resolution of the trained setting's task")
    p.add_argument("--task-noise", type=float, default=6.0, help="pixel noise std of the trained setting's task")
    p.add_argument("--steps", type=int, default=250, help="SGD steps of the trained setting")
    p.add_argument("--budget", type=float, default=40.0, help="seconds of timing per (model, batch)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch / tessera / ORT threads (1: the shared 2-core VM runs other jobs; with 2 "
                        "threads under that load a ResNet-18 call varied 0.24-1.4 s, with 1 it took 0.08-0.09 s)")
    p.add_argument("--out", default=DEFAULT_OUT)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(1)
    t0 = time.time()
    res = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__, "res": a.res,
           "lat_res": a.lat_res, "n": a.n, "load_before": os.getloadavg()[0], "quality": {}, "latency": {}, "setup_s": {}}
    try:
        import onnxruntime
        res["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        res["onnxruntime"] = None
    x = torch.randn(a.n, 3, a.res, a.res, generator=gen)
    task = TemplateTask(res=a.task_res, noise=a.task_noise)
    res["task"] = {"classes": task.classes, "res": a.task_res, "noise": a.task_noise, "steps": a.steps}
    task_x, task_y = task.sample(a.n, torch.Generator().manual_seed(5))
    for name in a.models.split(","):
        for setting in a.settings.split(","):
            model, runs, setup = build(name, setting, a.task_res if setting == "trained" else a.res, gen,
                                       task, a.steps)
            res["setup_s"][f"{name}/{setting}"] = setup
            if setting == "trained":
                q = quality(model, runs, task_x, a.chunk, task_y)
            else:
                q = quality(model, runs, x if setting == "default" else x[:a.n_recal], a.chunk)
            q["n"] = a.n if setting != "bn-recal" else min(a.n, a.n_recal)
            res["quality"][f"{name}/{setting}"] = q
            print(name, setting, json.dumps(q), flush=True)
            if setting == "default" and a.batches:
                if a.lat_res != a.res:
                    model, runs, _ = build(name, setting, a.lat_res, gen)
                for b in (int(v) for v in a.batches.split(",")):
                    lat = latency(runs, a.lat_res, b, gen, a.budget)
                    res["latency"][f"{name}/b{b}"] = lat
                    print(name, f"batch {b}", {k: v["median_ms"] for k, v in lat.items()}, flush=True)
    res["wall_s"] = time.time() - t0
    res["load_after"] = os.getloadavg()[0]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "table.md").write_text(table(res))
    cmd = " ".join([".venv/bin/python -m tessera.bench.cnn_models", *(sys.argv[1:] if argv is None else argv)])
    (out / "README.md").write_text(readme(res, cmd))
    print(table(res))


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def table(res) -> str:
    lines = [f"CPU: {res['cpu']} ({res['threads']} torch threads), torch {res['torch']}, onnxruntime "
             f"{res['onnxruntime']}; inputs N(0, 1) (trained setting: task samples); 1-min load average "
             f"{res['load_before']:.1f} before, {res['load_after']:.1f} after (2 cores, shared)", "",
             "## Quality vs fp32 eager: top-1 agreement / logit SQNR (dB)", "",
             "| model / setting | inputs | distinct fp32 top-1 | fp32 + 40 dB input noise | " +
             " | ".join(CONTENDERS[1:]) + " |", "|---|---|---|---|" + "---|" * (len(CONTENDERS) - 1)]
    for key, q in res["quality"].items():
        cells = [f"{100 * q[k]['top1_agreement']:.1f}% / {q[k]['sqnr_db']:.1f}" if k in q else "-"
                 for k in CONTENDERS[1:]]
        r = res["task"]["res"] if "task_accuracy" in q else res["res"]
        lines.append(f"| {key} | {q['n']} at {r}x{r} | {q['distinct_top1_fp32']} | "
                     f"{q['fp32_input_noise_40dB_sqnr']:.1f} dB | " + " | ".join(cells) + " |")
    trained = {k: q for k, q in res["quality"].items() if "task_accuracy" in q}
    if trained:
        t = res["task"]
        lines += ["", f"## Task accuracy, trained setting ({t['classes']} classes, {t['res']}x{t['res']}, "
                  f"noise {t['noise']}, {t['steps']} SGD steps)", "",
                  "| model | " + " | ".join(CONTENDERS) + " |", "|---|" + "---|" * len(CONTENDERS)]
        for key, q in trained.items():
            acc = q["task_accuracy"]
            lines.append(f"| {key} | " + " | ".join(f"{100 * acc[k]:.1f}%" if k in acc else "-"
                                                   for k in CONTENDERS) + " |")
    if res["latency"]:
        lines += ["", f"## Latency at {res['lat_res']}x{res['lat_res']}, median ms per call (default setting)", "",
                  "| model / batch | " + " | ".join(CONTENDERS) + " |", "|---|" + "---|" * len(CONTENDERS)]
    for key, lat in res["latency"].items():
        cells = [_f(lat[k]["median_ms"], ".1f") if k in lat else "-" for k in CONTENDERS]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def readme(res, cmd) -> str:
    doc = __doc__.split("\n", 4)[4]
    return (f"# CPU CNN static quantization: ResNet-18 and MobileNetV2\n\nCommand (repo root): `{cmd}` "
            f"({res['wall_s'] / 60:.1f} min)\n\nCPU: {res['cpu']}\n\n{doc}\n\nResults: table.md, results.json.\n")


if __name__ == "__main__":
    main()
