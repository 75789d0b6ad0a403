"""1x1 fp32 convs with few output channels: tessera's kernel route against the vendor route
(F.conv2d, oneDNN), forced per call (dispatch.forced), interleaved in one process
(tessera.bench.timing.time_interleaved, an untimed call before each sample, 25 samples, median),
channels-last x with bias, default threads.  Prints kernel time / vendor time per layer: below 1
the kernel wins.  MobileNetV2-like layers, batch 1 and 4.

    python narrow_routes.py > narrow_routes.txt
"""
import torch

import tessera
from tessera import dispatch
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved


def forced(m, f):
    def run():
        with dispatch.forced(m):
            return f()
    return run


print("cpu:", machine_info().get("cpu"), "|", torch.get_num_threads(), "threads | torch", torch.__version__)
for ci, co, H, N in [(144, 24, 56, 1), (96, 24, 56, 1), (32, 16, 112, 1), (192, 32, 28, 1), (192, 32, 28, 4),
                     (144, 32, 56, 1), (144, 24, 56, 4), (240, 40, 28, 1), (240, 40, 28, 4), (384, 64, 14, 4),
                     (576, 48, 14, 4)]:
    g = torch.Generator().manual_seed(ci * co)
    x = torch.randn(N, ci, H, H, generator=g).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(co, ci, 1, 1, generator=g), torch.randn(co, generator=g)
    f = lambda: tessera.conv2d(x, w, b)  # noqa: E731
    res = time_interleaved({"k": forced("kernel", f), "v": forced("vendor", f)}, 25, rewarm_below_s=1.0)
    print(f"{ci}->{co} at {H}x{H} b{N} (M={N * H * H}): kernel/vendor {res['k'].median / res['v'].median:.2f}",
          flush=True)
