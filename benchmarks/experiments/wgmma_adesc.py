"""Probe (LOG "wgmma v8"): A read by the tensor cores from shared memory, clusters of 1, 2 or 4 CTAs
multicasting x; 2:4, fp16, L2 flushed; every output checked against float64."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_nm_decode import SHAPES, seconds  # noqa: E402
from spartune.backends import cusparselt  # noqa: E402
from spartune.kernels import spmm_nm as K  # noqa: E402
from spartune.prune import sparsify_weight  # noqa: E402

C = K.Config
TILES = [(128, 256, 4), (256, 128, 4), (256, 128, 5)]
VARIANTS = {"c1": (1, (8, 16)), "c2": (2, (4, 8))}  # tag: (cluster_m, group_m values)
CONFIGS = {tag: [C(bm, bn, 12, variant="wgmma", stages=st, group_m=g, cluster_m=cm)
                 for bm, bn, st in TILES for g in gs] for tag, (cm, gs) in VARIANTS.items()}
ns = [int(v) for v in os.environ.get("NS", "2048").split()]
shapes = os.environ.get("SHAPES", "llama7b-up llama7b-down llama13b-up llama70b-up").split()
rows = []
for name in shapes:
    M, Kd = SHAPES[name]
    for N in ns:
        torch.manual_seed(N)
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = sparsify_weight(w, "2:4")
        wd = A.to_dense()
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        expect = (x.double() @ wd.double().T).float()
        row = dict(shape=name, N=N, dense=seconds(lambda: F.linear(x, wd)), cslt=float("nan"))
        for fn in (cusparselt.cusparselt_linear, cusparselt.cusparselt_search_linear):
            try:
                fn(A, x, out, transposed_ok=True)
                row["cslt"] = min(row["cslt"], seconds(lambda: fn(A, x, out, transposed_ok=True))) \
                    if row["cslt"] == row["cslt"] else seconds(lambda: fn(A, x, out, transposed_ok=True))
            except Exception:  # noqa: BLE001
                pass
        for tag, cfgs in CONFIGS.items():
            res = []
            for cfg in cfgs:
                out.fill_(float("nan"))
                K.launch(A, x, out, cfg)
                err = ((out.float() - expect).norm() / expect.norm()).item()
                if not err < 1e-2:
                    print("WRONG", name, N, cfg, err, flush=True)
                    continue
                res.append((seconds(lambda: K.launch(A, x, out, cfg)), str(cfg)))
            res.sort()
            row[tag] = res
            if res:
                print(name, N, tag, " ".join(f"{t*1e6:.1f}" for t, _ in res[:3]), res[0][1], flush=True)
        rows.append(row)
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "out"), "wgmma_adesc.json"), "w"), indent=1)
print(f"{'shape':14} {'N':>5} {'cuBLAS':>8} {'cuSPLt':>8} " + " ".join(f"{t:>9}" for t in CONFIGS) + "   (us; best x dense, x cuSPARSELt)")
for r in rows:
    best = {t: r[t][0][0] if r.get(t) else float("nan") for t in CONFIGS}
    b = min(best.values())
    print(f"{r['shape']:14} {r['N']:5} {r['dense']*1e6:8.1f} {r['cslt']*1e6:8.1f} " + " ".join(f"{best[t]*1e6:9.1f}" for t in CONFIGS)
          + f"   {r['dense']/b:.2f} {r['cslt']/b:.2f}")
