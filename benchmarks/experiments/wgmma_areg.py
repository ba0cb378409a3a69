"""Probe (LOG "wgmma v7"): the wgmma variant with A straight into registers (a_ahead > 0) beside
the shared-memory A configs, cuBLAS and cuSPARSELt; 2:4, fp16, L2 flushed (do_bench)."""
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
BASE = [C(128, 256, 12, variant="wgmma", stages=s, group_m=g) for s in (4, 5) for g in (8, 16)] + \
       [C(256, 128, 12, variant="wgmma", stages=5, group_m=g) for g in (8, 16)]
NEW = [C(128, 256, 8, variant="wgmma", stages=6, group_m=g, a_ahead=a, a_prefetch=p)
       for a, p in ((3, 8), (4, 0), (4, 8), (6, 0), (6, 8)) for g in (8, 16)] + \
      [C(256, 128, 8, variant="wgmma", stages=8, group_m=g, a_ahead=2, a_prefetch=p) for p in (0, 8) for g in (8, 16)]
ns = [int(v) for v in os.environ.get("NS", "2048").split()]
shapes = os.environ.get("SHAPES", "llama7b-up llama7b-down llama13b-up llama70b-up").split()
rows = []
for name in shapes:
    M, Kd = SHAPES[name]
    for N in ns:
        torch.manual_seed(0)
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = sparsify_weight(w, "2:4")
        wd = A.to_dense()
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        expect = (x.double() @ wd.double().T).float()
        row = dict(shape=name, N=N, dense=seconds(lambda: F.linear(x, wd)))
        try:
            cusparselt.cusparselt_search_linear(A, x, out, transposed_ok=True)
            row["cslt"] = seconds(lambda: cusparselt.cusparselt_search_linear(A, x, out, transposed_ok=True))
        except Exception as e:  # noqa: BLE001
            row["cslt"] = float("nan")
        for tag, cfgs in (("base", BASE), ("new", NEW)):
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
            print(name, N, tag, " ".join(f"{t*1e6:.1f}" for t, _ in res[:3]), res[0][1], flush=True)
        rows.append(row)
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "out"), "wgmma_areg.json"), "w"), indent=1)
print(f"{'shape':14} {'N':>5} {'cuBLAS':>8} {'cuSPLt':>8} {'base':>8} {'new':>8} {'x dense b/n':>12} {'x cslt n':>8}")
for r in rows:
    b, n = r["base"][0][0], r["new"][0][0] if r["new"] else float("nan")
    print(f"{r['shape']:14} {r['N']:5} {r['dense']*1e6:8.1f} {r['cslt']*1e6:8.1f} {b*1e6:8.1f} {n*1e6:8.1f} "
          f"{r['dense']/b:5.2f}/{r['dense']/n:5.2f} {r['cslt']/n:8.2f}")
    print("   best new:", r["new"][0][1] if r["new"] else "-")
