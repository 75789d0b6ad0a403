"""table.md from bench.json: every opencl row beside the cpu backend and eager (same run).
Usage: python make_table.py [bench.json] > table.md"""
import json
import sys

d = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "bench.json"))
print("| op | case | dtype | dir | opencl GB/s | opencl % NT-copy ceiling | cpu % | opencl x eager | opencl time / cpu time |")
print("|---|---|---|---|---|---|---|---|---|")
for r in d["rows"]:
    ms = r["ms"]
    if "tessera-opencl" not in ms:
        continue
    pct, gb = r.get("pct_roofline") or {}, r.get("gbps") or {}
    f = lambda v, fmt: "-" if v is None else fmt.format(v)
    case = r["case"] + (" (cache-resident)" if r.get("cache_resident") else "")
    print(f"| {r['op']} | {case} | {r['dtype']} | {r['dir']} | {f(gb.get('tessera-opencl'), '{:.1f}')} | "
          f"{f(pct.get('tessera-opencl'), '{:.0f}%')} | {f(pct.get('tessera-cpu'), '{:.0f}%')} | "
          f"{f(ms.get('eager') and ms['eager'] / ms['tessera-opencl'], '{:.2f}')} | "
          f"{f(ms.get('tessera-cpu') and ms['tessera-opencl'] / ms['tessera-cpu'], '{:.2f}')} |")
