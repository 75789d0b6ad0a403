"""Depthwise 3x3 conv forward (MobileNetV2 layers, channels-last, bias + relu6) per dtype:
tessera's kernel vs its vendor route vs eager F.conv2d + relu6, medians of 25 calls, best of 2
rounds, alternated in one process."""
import statistics
import time

import torch
import torch.nn.functional as F

import tessera
from tessera import dispatch
from tessera.bench.report import machine_info

torch.set_num_threads(2)


def med(f, n=25):
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


mi = machine_info()
print("cpu:", mi.get("cpu"), "| isa", mi.get("isa"), "| torch", torch.__version__, "| threads", torch.get_num_threads())
for dt in (torch.float32, torch.bfloat16, torch.float16):
    for (b, C, H, s) in [(1, 32, 112, 1), (1, 96, 112, 2), (1, 144, 56, 1), (1, 384, 14, 1), (1, 960, 7, 1),
                         (8, 144, 56, 1), (8, 384, 14, 1), (8, 960, 7, 1)]:
        x = torch.randn(b, C, H, H).to(dt).contiguous(memory_format=torch.channels_last)
        w, bb = torch.randn(C, 1, 3, 3).to(dt), torch.randn(C).to(dt)
        r = {}
        for _ in range(2):
            for m in ("kernel", "vendor"):
                with dispatch.forced(m):
                    v = med(lambda: tessera.conv2d(x, w, bb, stride=s, padding=1, groups=C, activation="relu6"))
                r[m] = min(r.get(m, 9e9), v)
            v = med(lambda: F.relu6(F.conv2d(x, w, bb, s, 1, 1, C)))
            r["eager"] = min(r.get("eager", 9e9), v)
        print(f"{str(dt)[6:]:8s} b{b} {C}x{H}x{H} s{s}: kernel {r['kernel']:.3f} vendor {r['vendor']:.3f} "
              f"eager {r['eager']:.3f} ms | kernel/vendor {r['kernel'] / r['vendor']:.2f} "
              f"eager/kernel {r['eager'] / r['kernel']:.2f}", flush=True)
