"""conv2d forward at batch 1 and 8 (ResNet-18 / MobileNetV2 layer shapes, fp32, channels-last):
tessera.conv2d with the C++ twin (csrc/fastpath_conv2d.h) vs the same call through the Python
body (the twin switched off per call) vs eager F.conv2d + activation, interleaved in one process
(tessera.bench.timing.time_interleaved; an untimed call before each sample, so no contender pays
for the page faults of the 25 MB buffers eager frees just before it), TESSERA_DISPATCH=auto.

    python benchmarks/results/2026-12-06f-cpu-conv2d-fastpath/conv2d_ab.py > out.txt
"""
import platform
import sys

import torch
import torch.nn.functional as F

import tessera
from tessera import _fastpath, _library
from tessera.bench.timing import time_interleaved
from tessera.ops.conv2d import _bench_cases, _conv2d_impl

ACT = {None: lambda y: y, "relu": F.relu, "relu6": F.relu6}


def main(batches=(1, 8), repeats=61):
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    print(f"# {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    torch.manual_seed(0)
    with torch.no_grad():
        tessera.silu(torch.randn(4))
        print(f"# {_fastpath.status()}")
        twin = _library._FAST[_conv2d_impl]

        def python_path(call):
            def f():
                _library._FAST.pop(_conv2d_impl)
                try:
                    return call()
                finally:
                    _library._FAST[_conv2d_impl] = twin
            return f

        print(f"{'row':32s} {'eager ms':>9s} {'x eager (twin)':>15s} {'x eager (python)':>17s} {'twin/python':>12s}")
        for case in _bench_cases():
            kw = case.make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
            if kw["x"].shape[0] not in batches:
                continue
            x, w, b = kw.pop("x"), kw.pop("weight"), kw.pop("bias")
            act = kw.pop("activation", None)
            call = lambda: tessera.conv2d(x, w, b, activation=act, **kw)
            fns = {"eager": lambda: ACT[act](F.conv2d(x, w, b, **kw)), "twin": call, "python": python_path(call)}
            t = time_interleaved(fns, repeats, rewarm_below_s=1.0)
            e, tw, py = (t[k].median for k in ("eager", "twin", "python"))
            print(f"{case.name:32s} {e * 1e3:9.3f} {e / tw:15.2f} {e / py:17.2f} {py / tw:12.2f}", flush=True)


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or (1, 8))
