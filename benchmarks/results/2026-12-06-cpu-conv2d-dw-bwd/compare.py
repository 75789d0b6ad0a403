import json, statistics, sys
def load(p):
    d = json.load(open(p)); rows = d["rows"] if isinstance(d, dict) and "rows" in d else d
    return {(r["case"], r["dtype"], r["dir"]): r for r in rows if r.get("op") == "conv2d"}
a = load(sys.argv[1]); b = load(sys.argv[2])
grp = {}
for k in b:
    if k not in a: continue
    sa = a[k]["speedup"]["tessera-cpu"]["eager"]; sb = b[k]["speedup"]["tessera-cpu"]["eager"]
    dwk = "-dw-" in k[0]
    grp.setdefault((("dw" if dwk else "dense"), k[1], k[2]), []).append((sa, sb))
    if dwk or len(sys.argv) > 3: print(f"{k[0]:28s} {k[1]:5s} {k[2]} before {sa:.2f} after {sb:.2f}  ({b[k]['ms']['tessera-cpu']:.3f} ms)")
allb = [b[k]["speedup"]["tessera-cpu"]["eager"] for k in b]
for g, v in sorted(grp.items()):
    print(g, "median before %.2f after %.2f" % (statistics.median(x for x, _ in v), statistics.median(y for _, y in v)))
print("all conv2d median after %.2f (n=%d)" % (statistics.median(allb), len(allb)))
