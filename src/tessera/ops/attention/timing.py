"""Standalone CPU timing of ``tessera.attention`` against ``F.scaled_dot_product_attention``.

    python -m tessera.ops.attention.timing [--reps 5] [--seq 1024,2048] [--dtypes float32,bfloat16] [--no-bwd]

The spec's bench cases (batch 1, 32 q heads, 8 kv heads, head_dim 128, causal).  Each
measurement is the median of ``reps`` interleaved runs (tessera, SDPA, tessera, ...), so both see
the same machine state; the fp32 matmul peak (torch.matmul 2048^3) is measured in the same run.
FLOPs count only the allowed (causal) score entries: 4*D per entry forward, 2.5x that backward.
Backward times only the backward: tessera's ``tessera::attention_backward`` op on saved forward
outputs, SDPA's autograd graph re-run with ``retain_graph``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import tessera
from tessera.backends import cpu as cpu_backend

from .spec import allowed_pairs


def _medians(fns, reps):
    ts = [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            t = time.perf_counter()
            f()
            ts[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in ts]


def _line(what, fl, tt, ts, peak, diff):
    g_t, g_s = fl / tt / 1e9, fl / ts / 1e9
    return (f"{what}: tessera {tt * 1e3:7.1f} ms {g_t:6.1f} GFLOP/s ({g_t / peak:4.0%} of fp32 matmul) | "
            f"SDPA {ts * 1e3:7.1f} ms {g_s:6.1f} GFLOP/s | speedup {ts / tt:.2f}x | max diff {diff:.1e}")


def run(reps=5, seqs=(1024, 2048), dtypes=(torch.float32, torch.bfloat16), bwd=True, B=1, Hq=32, Hk=8, D=128):
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    peak = 2 * 2048 ** 3 / _medians([lambda: a @ b], 5)[0] / 1e9
    print(f"threads {torch.get_num_threads()}, isa {cpu_backend.isa()}, "
          f"fp32 matmul 2048^3: {peak:.1f} GFLOP/s")
    for dt in dtypes:
        for S in seqs:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(B, S, h, D, generator=g).to(dt) for h in (Hq, Hk, Hk))
            fl = 4 * D * Hq * B * allowed_pairs(S, S, -1, 0)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

            def f_t():
                return tessera.attention(q, k, v, causal=True, backend="cpu")

            def f_s():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)

            diff = (f_t().float() - f_s().transpose(1, 2).float()).abs().max().item()
            tt, ts = _medians([f_t, f_s], reps)
            name = f"{str(dt)[6:]:8s} S={S}"
            print(_line(f"{name} fwd", fl, tt, ts, peak, diff))
            if not bwd:
                continue
            out, lse = torch.ops.tessera.attention(q, k, v, None, None, None, None, None, -1, 0, 0.0, "cpu")
            do = torch.randn(out.shape, generator=g).to(dt)
            qs, ks, vs = (x.detach().clone().requires_grad_() for x in (qt, kt, vt))
            o_s = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

            def b_t():
                return torch.ops.tessera.attention_backward(do, q, k, v, out, lse, None, None, None, None, None,
                                                            -1, 0, 0.0, "cpu")

            def b_s():
                return torch.autograd.grad(o_s, (qs, ks, vs), do.transpose(1, 2), retain_graph=True)

            diff = max((x.float() - y.transpose(1, 2).float()).abs().max().item() for x, y in zip(b_t(), b_s()))
            tt, ts = _medians([b_t, b_s], reps)
            print(_line(f"{name} bwd", 2.5 * fl, tt, ts, peak, diff))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seq", default="1024,2048")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--no-bwd", action="store_true")
    args = p.parse_args(argv)
    run(args.reps, [int(s) for s in args.seq.split(",")], [getattr(torch, d) for d in args.dtypes.split(",")],
        not args.no_bwd)


if __name__ == "__main__":
    main()
