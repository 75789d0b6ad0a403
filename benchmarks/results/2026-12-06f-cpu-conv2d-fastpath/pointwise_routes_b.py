import os, torch
import tessera
from tessera.bench.timing import time_interleaved
torch.manual_seed(0)
def mk(mode, x, w, b):
    def f():
        os.environ["TESSERA_DISPATCH"] = mode
        return tessera.conv2d(x, w, b)
    return f
with torch.no_grad():
    for cin, cout, h in [(144, 24, 56), (96, 24, 56), (192, 32, 28), (384, 64, 14), (24, 144, 56), (32, 192, 28), (144, 32, 56), (240, 40, 28)]:
        row = []
        for n in (1, 4):
            x = torch.randn(n, cin, h, h).contiguous(memory_format=torch.channels_last)
            w = torch.randn(cout, cin, 1, 1) * cin ** -0.5; b = torch.randn(cout)
            t = time_interleaved({"k": mk("kernel", x, w, b), "v": mk("vendor", x, w, b)}, 21, rewarm_below_s=1.0)
            row.append(f"M={n*h*h}: k/v {t['k'].median / t['v'].median:.2f}")
        print(f"{cin}->{cout}", " | ".join(row), flush=True)
