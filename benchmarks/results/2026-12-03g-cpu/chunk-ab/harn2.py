"""Interleaved comparison of decode_attention.c builds (each a .so made by build.sh) on the bench's
decode shapes, with the bench's layout read timed in the same loop.

    ./build.sh old <dir with the old decode_attention.c, decode_fast.h, splits.h>
    ./build.sh new <dir with the new ones>
    python harn2.py old,new 1x16384,16x1024,4x4096,16x4096
"""
import ctypes, os, time, torch, statistics, importlib, sys
HERE = os.path.dirname(os.path.abspath(__file__))
from tessera.backends import cpu
dc = importlib.import_module("tessera.ops.decode_attention.cases")
dcpu = importlib.import_module("tessera.ops.decode_attention.cpu")
names = sys.argv[1].split(",")
fns = {}
for v in names:
    f = ctypes.CDLL(os.path.join(HERE, f"{v}.so")).tsr_decode_attention
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 7 + [ctypes.c_float] * 2 + [ctypes.c_int64] + [ctypes.c_int] * 3 + [ctypes.c_int64]
    fns[v] = f
g = torch.Generator().manual_seed(0)
shapes = [(1, 16384), (16, 1024)] if len(sys.argv) < 3 else [tuple(map(int, s.split("x"))) for s in sys.argv[2].split(",")]
reps = 21
for variant in ("same", torch.int8):
  for B, ctx in shapes:
    kw = dc.build("x", B, 32, 8, 128, 16, [ctx] * B, variant=variant).make(torch.bfloat16, "cpu", g)
    q, kc, vc, bt, sl = kw["q"], kw["k_cache"], kw["v_cache"], kw["block_table"], kw["seq_lens"]
    if os.environ.get("BT") == "id":
        kc = kc.nan_to_num() if kc.is_floating_point() else kc; vc = vc.nan_to_num() if vc.is_floating_point() else vc
        for nm in ("k_scale", "v_scale"):
            if kw[nm] is not None: kw[nm] = kw[nm].nan_to_num()
        bt = torch.arange(bt.numel(), dtype=torch.int32).view(bt.shape).contiguous()
    kvb = B * ctx * 8 * 128 * 2 * kc.element_size()
    out = torch.empty_like(q)
    a = (cpu.ptr(q), cpu.ptr(kc), cpu.ptr(vc), cpu.ptr(kw["k_scale"]), cpu.ptr(kw["v_scale"]), cpu.ptr(bt), cpu.ptr(sl), cpu.ptr(out),
         B, 32, 8, 128, 16, bt.shape[1], kc.shape[0], 128 ** -0.5, 0.0, -1, cpu.DTYPE_CODE[q.dtype], dcpu.CACHE_CODE[kc.dtype], 2, 1)
    outs = {}
    from tessera.ops.decode_attention import cpu as dcpu2
    lay = dcpu2.paged_read({**kw, "k_cache": kc, "v_cache": vc, "block_table": bt})
    res = {v: [] for v in list(fns) + ["read"]}
    for r in range(reps):
        for v, f in fns.items():
            t = time.perf_counter(); rc = f(*a); res[v].append(time.perf_counter() - t)
            assert rc == 0
            outs[v] = out.clone()
        t = time.perf_counter(); lay(); res["read"].append(time.perf_counter() - t)
    o0 = outs[names[0]]
    for v in names[1:]:
        assert torch.allclose(outs[v].float(), o0.float(), atol=2e-2, rtol=2e-2), v
    rd = statistics.median(res["read"])
    print(str(variant)[-5:], f"B{B} ctx{ctx}", f"read {kvb/rd/1e9:.1f} GB/s |", "  ".join(f"{v}: {statistics.median(x)*1e3:.2f} ms {kvb/statistics.median(x)/1e9:.1f} GB/s ({rd/statistics.median(x)*100:.0f}%)" for v, x in res.items() if v != "read"), flush=True)
