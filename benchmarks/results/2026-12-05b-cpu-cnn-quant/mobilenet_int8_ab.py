import torch, tessera, time
from tessera.testing.cnn_models import mobilenet_v2
from tessera.ops._requant import cpu as rq
torch.set_num_threads(1)
torch.manual_seed(0)
m = mobilenet_v2().eval()
g = torch.Generator().manual_seed(0)
cal = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)]
q = tessera.quantize(m, "int8-static", calibration=cal)
x = torch.randn(1, 3, 224, 224)
on, off = [], []
with torch.no_grad():
    for r in range(15):
        for flag, acc in ((True, on), (False, off)):
            rq._k3_available = (lambda: True) if flag else (lambda: False)
            q(x); t = time.perf_counter(); q(x); acc.append(time.perf_counter() - t)
med = lambda v: sorted(v)[len(v)//2] * 1e3
print(f"MobileNetV2 int8 b1: k3 {med(on):.2f} ms, tap loop {med(off):.2f} ms, ratio {med(off)/med(on):.2f}")
