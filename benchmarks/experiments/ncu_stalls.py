import csv, collections, sys
def load(f):
    rows=list(csv.reader(open(f)))
    i=next(i for i,r in enumerate(rows) if r and r[0]=="Address")
    h=rows[i]; data=[dict(zip(h,r)) for r in rows[i+1:] if len(r)==len(h)]
    return h,data
for f in sys.argv[1:]:
    h,data=load(f)
    reasons=[c for c in h if c.startswith("stall_") and "Not Issued" not in c]
    tot=sum(float(r["Warp Stall Sampling (All Samples)"] or 0) for r in data)
    byr=collections.Counter(); byop=collections.Counter(); byopr=collections.defaultdict(collections.Counter)
    for r in data:
        src=r["Source"].split()
        op=src[1] if src and src[0].startswith("@") and len(src)>1 else (src[0] if src else "?")
        op=op.split(".")[0]
        n=float(r["Warp Stall Sampling (All Samples)"] or 0)
        byop[op]+=n
        for c in reasons:
            v=float(r[c] or 0); byr[c]+=v; byopr[op][c]+=v
    print(f, "samples", tot)
    print("  reasons:", ", ".join(f"{k[6:]} {100*v/tot:.1f}" for k,v in byr.most_common(8)))
    for op,n in byop.most_common(10):
        top=", ".join(f"{k[6:]} {100*v/tot:.1f}" for k,v in byopr[op].most_common(3))
        print(f"   {op:10s} {100*n/tot:5.1f}%  ({top})")
