"""int8-static / a16w8-static ResNet-18 and MobileNetV2 (batch 1, 224x224, one thread) with the
integer residual adds and code max-pooling of this change against the same quantized models with
the float glue they replaced (dequantize both operands, add, quantize at the next layer; max-pool a
float copy of the codes), timed interleaved in one process (tessera.bench.timing.time_interleaved,
an untimed call before each sample, median), with eager fp32 (channels-last input) as the
reference point; and the logit SQNR of both against fp32 on the same 32 inputs.

    python model_ab.py > model_ab.txt
"""
import torch

import tessera
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved
from tessera.quant import static as S
from tessera.testing.cnn_models import mobilenet_v2, resnet18


INT_POOL = S._max_pool_codes


def glue_pool(q, *a, **k):
    return torch.nn.functional.max_pool2d(q.float(), *a, **k).to(q.dtype)


def quantize_with_float_adds(m, recipe, cal):
    """The previous plan: the adds stay float steps (the next layer quantizes the sum)."""
    add = S._add_operands
    S._add_operands = lambda n: None
    try:
        return tessera.quantize(m, recipe, calibration=cal)
    finally:
        S._add_operands = add


def with_glue_pool(q, x):
    """Run q with max pooling on float copies of the codes (the previous _run_codes)."""
    S._max_pool_codes = glue_pool
    try:
        return q(x)
    finally:
        S._max_pool_codes = INT_POOL


def sqnr(ref, y):
    return float(20 * torch.log10(ref.norm() / (ref - y).norm()))


def main():
    torch.set_num_threads(1)
    print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
    print(f"{'model':13s} {'recipe':13s} {'eager fp32':>10s} {'integer':>9s} {'float glue':>10s} {'speedup':>8s} "
          f"{'SQNR int':>9s} {'SQNR glue':>9s}")
    for name, make in (("resnet18", resnet18), ("mobilenet_v2", mobilenet_v2)):
        torch.manual_seed(0)
        m = make().eval()
        g = torch.Generator().manual_seed(0)
        cal = [torch.randn(8, 3, 224, 224, generator=g) for _ in range(2)]
        xq = torch.randn(32, 3, 224, 224, generator=g)
        x = torch.randn(1, 3, 224, 224, generator=g)
        xc = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            y0 = m(xq)
            for recipe in ("int8-static", "a16w8-static"):
                qi = tessera.quantize(m, recipe, calibration=cal)
                qf = quantize_with_float_adds(m, recipe, cal)
                runs = {"eager": lambda: m(xc), "int": lambda: qi(x), "glue": lambda: with_glue_pool(qf, x)}
                t = time_interleaved(runs, 15, rewarm_below_s=1.0)
                si, sf = sqnr(y0, qi(xq)), sqnr(y0, with_glue_pool(qf, xq))
                e, ti, tf = (t[k].median * 1e3 for k in ("eager", "int", "glue"))
                print(f"{name:13s} {recipe:13s} {e:10.2f} {ti:9.2f} {tf:10.2f} {tf / ti:8.2f} {si:9.1f} {sf:9.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
