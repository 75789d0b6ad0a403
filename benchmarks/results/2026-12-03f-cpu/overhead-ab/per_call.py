import sys, time, statistics, torch, json
import tessera
from tessera.bench import runner, timing
out = {}
with torch.no_grad():
    for op in sys.argv[1].split(","):
        spec = tessera.OPS[op]
        case = runner.tiny_case(spec)
        kw = case.make(spec.dtypes[0], torch.device("cpu"), torch.Generator().manual_seed(0))
        f = lambda: spec.fn(**kw)
        f()
        ts = []
        for r in range(9):
            t = time.perf_counter()
            for _ in range(1000): f()
            ts.append((time.perf_counter() - t) / 1000)
        out[op] = statistics.median(ts) * 1e6
print(json.dumps(out))
