"""The int8 requantized GEMM at K <= 64 on AMX tiles K bytes wide (qi8_amx.h qa_narrow) against the
VNNI kernel, one process: TESSERA_QI8_VNNI=1 (AMX where the CPU has it) and =2 (VNNI only) timed
interleaved (tessera.bench.timing.time_interleaved, an untimed call before each sample, median), one
thread, random int8 codes.  Rows: MobileNetV2's pointwise layers (x read in place: qa_direct) and its
3-channel 3x3 stride-2 stem (im2col rows made in the GEMM: qa_narrow_u8), batch 1 and 8; each pair's
outputs are checked equal first.

    python pw_ab.py > pw_ab.txt
"""
import os

import torch

import tessera
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved

# (batch, C, H = W, N, kernel, stride)
SHAPES = [(1, 32, 112, 16, 1, 1), (8, 32, 112, 16, 1, 1), (1, 16, 112, 96, 1, 1), (8, 16, 112, 96, 1, 1),
          (1, 24, 56, 144, 1, 1), (8, 24, 56, 144, 1, 1), (1, 32, 28, 192, 1, 1), (8, 32, 28, 192, 1, 1),
          (1, 64, 14, 384, 1, 1), (8, 64, 14, 384, 1, 1), (1, 3, 224, 32, 3, 2), (8, 3, 224, 32, 3, 2)]


def main():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
    print(f"{'layer':26s} {'AMX us':>9s} {'VNNI us':>9s} {'VNNI / AMX':>11s}")
    for n, C, hw, N, k, st in SHAPES:
        x = torch.randint(-128, 128, (n, C, hw, hw), generator=g, dtype=torch.int8).contiguous(
            memory_format=torch.channels_last)
        w = torch.randint(-127, 128, (N, C, k, k), generator=g, dtype=torch.int8)
        b = torch.randint(-5000, 5000, (N,), generator=g, dtype=torch.int32)
        m = torch.randint(2**29, 2**31 - 1, (N,), generator=g, dtype=torch.int64).to(torch.int32)
        s = torch.randint(-12, -7, (N,), generator=g, dtype=torch.int32)

        def run(flag):
            def f():
                os.environ["TESSERA_QI8_VNNI"] = flag
                return tessera.conv2d_int8(x, -7, w, b, m, s, 3, st, k // 2, backend="cpu")
            return f
        assert torch.equal(run("1")(), run("2")())
        t = time_interleaved({"amx": run("1"), "vnni": run("2")}, 15 if n == 8 else 41)
        a, v = t["amx"].median, t["vnni"].median
        tag = f"b{n} {C}x{hw}->{N} k{k} s{st}"
        print(f"{tag:26s} {a * 1e6:9.1f} {v * 1e6:9.1f} {v / a:11.2f}", flush=True)
    os.environ.pop("TESSERA_QI8_VNNI")


if __name__ == "__main__":
    main()
