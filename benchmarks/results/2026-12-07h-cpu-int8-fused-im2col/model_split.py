"""Where a whole int8-static model's time goes: one forward of quantized ResNet-18 / MobileNetV2
(random-init torchvision architectures, calibrated on 4 batches of 8 random 64x64 inputs, 224x224
inputs, one thread), each kind of step timed inside the model as it runs (perf_counter around
StaticQuantConv2d / StaticQuantLinear / StaticQuantAdd.forward_codes, QParams.quantize /
dequantize and the max-pool on codes); "rest" is the model's own Python and the float steps.
Mean ms per forward over 200 (batch 1) or 20 (batch 8) forwards after 5 untimed ones.  Unlike
layer_ab.py, which repeats one layer on one input (its weights and im2col matrix stay in cache),
this is each layer as the model meets it.  The tessera timed is whatever `import tessera` finds.

    python model_split.py {resnet18,mobilenet_v2} {1,8}
"""
import sys
import time

import torch

import tessera
from tessera.bench.report import machine_info
from tessera.quant import static
from tessera.testing.cnn_models import mobilenet_v2, resnet18


def main(name, batch):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
    g = torch.Generator().manual_seed(0)
    q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
    x = torch.randn(batch, 3, 224, 224)
    spent: dict = {}

    def timed(fn, kind):
        def f(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            spent[kind] = spent.get(kind, 0.0) + time.perf_counter() - t
            return r
        return f

    for cls, meth, kind in ((static.StaticQuantConv2d, "forward_codes", "conv"),
                            (static.StaticQuantLinear, "forward_codes", "linear"),
                            (static.StaticQuantAdd, "forward_codes", "add"),
                            (static.QParams, "quantize", "quantize"), (static.QParams, "dequantize", "dequantize")):
        setattr(cls, meth, timed(getattr(cls, meth), kind))
    static._max_pool_codes = timed(static._max_pool_codes, "maxpool")
    n = 200 if batch == 1 else 20
    with torch.no_grad():
        for _ in range(5):
            q(x)
        spent.clear()
        t = time.perf_counter()
        for _ in range(n):
            q(x)
        total = (time.perf_counter() - t) / n * 1e3
    parts = {k: v / n * 1e3 for k, v in spent.items()}
    print(f"{name} batch {batch} | cpu: {machine_info().get('cpu')} | 1 thread | tessera from {tessera.__file__}")
    print(f"total {total:.2f} ms: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
          + f", rest {total - sum(parts.values()):.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
