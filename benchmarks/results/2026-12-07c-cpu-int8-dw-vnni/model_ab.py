"""int8-static ResNet-18 and MobileNetV2 (224x224, one thread, batch 1 and 8) as they stand against
the same quantized models with TESSERA_RQ_FP32=0 and TESSERA_DW_VNNI=0 (the integer
requantization and the fp32-FMA depthwise kernel this change added alternatives to; bit-identical
logits, asserted), with eager fp32 (channels-last input) as the reference point; timed interleaved
in one process (tessera.bench.timing.time_interleaved, an untimed call before each sample, median).

    python model_ab.py > model_ab.txt
"""
import os

import torch

import tessera
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved
from tessera.testing.cnn_models import mobilenet_v2, resnet18

OFF = ("TESSERA_RQ_FP32", "TESSERA_DW_VNNI")


def previous(q, x):
    for k in OFF:
        os.environ[k] = "0"
    try:
        return q(x)
    finally:
        for k in OFF:
            os.environ.pop(k, None)


def main():
    torch.set_num_threads(1)
    print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
    print(f"{'model':13s} {'batch':>5s} {'eager fp32':>10s} {'int8':>8s} {'previous':>9s} {'int8 / previous':>16s} "
          f"{'x eager':>8s}")
    for name, make in (("resnet18", resnet18), ("mobilenet_v2", mobilenet_v2)):
        torch.manual_seed(0)
        m = make().eval()
        g = torch.Generator().manual_seed(0)
        q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 224, 224, generator=g) for _ in range(2)])
        with torch.no_grad():
            for b in (1, 8):
                x = torch.randn(b, 3, 224, 224, generator=g)
                xc = x.contiguous(memory_format=torch.channels_last)
                assert torch.equal(q(x), previous(q, x))
                runs = {"eager": lambda: m(xc), "int8": lambda: q(x), "previous": lambda: previous(q, x)}
                t = time_interleaved(runs, 15 if b == 1 else 7, rewarm_below_s=1.0)
                e, n, o = (t[k].median * 1e3 for k in ("eager", "int8", "previous"))
                print(f"{name:13s} {b:5d} {e:10.2f} {n:8.2f} {o:9.2f} {o / n:16.2f} {e / n:8.2f}", flush=True)


if __name__ == "__main__":
    main()
