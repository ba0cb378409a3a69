"""Probe (session 26): 2:4 decode at N = 16 with 16 warps a CTA (one CTA an SM, the ring's bytes in
flight of two 8-warp CTAs, x staged once per 32 rows) beside the tuned picks, cold replays in
turns: python nm_n16_warps.py [--rounds 3]. ncu (nm_n16_ncu.py) found the 16-token pick at one
8-warp CTA an SM (128 row blocks of 32 rows at 7B down) where the N = 1 pick runs two."""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

C = K.Config
BASE = {"llama7b-down": ((4096, 11008), [C(32, 16, 8, 4, 4, stages=3, cluster_m=2)]),
        "llama13b-up": ((13824, 5120), [C(32, 16, 4, 2, 4, stages=3, cluster_m=4)]),
        "llama7b-up": ((11008, 4096), [C(32, 16, 8, 2, 4, stages=3, cluster_m=4)])}
NEW = [C(128, 16, 16, 4, 2, stages=s, cluster_m=m) for s in (3, 4) for m in (1, 2)] \
    + [C(128, 16, 16, 8, 1, stages=s, cluster_m=m) for s in (3, 4) for m in (1, 2)] \
    + [C(64, 16, 16, 4, 4, stages=3, cluster_m=m) for m in (1, 2)]

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--shapes", nargs="+", default=["llama13b-up", "llama7b-up"])
args = ap.parse_args()
out_dir = os.environ.get("OUT", "out")
results = []
for name in args.shapes:
    (M, Kd), base = BASE[name]
    torch.manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "2:4")
    x = torch.randn(16, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(16, M, device="cuda", dtype=torch.float16)
    ref = F.linear(x.double(), A.to_dense().double())
    cands = {}
    for cfg in base + NEW:
        try:
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            torch.cuda.synchronize()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                print(name, cfg, "WRONG", err)
                continue
            cands[cfg] = []
        except Exception as e:  # noqa: BLE001
            print(name, cfg, "failed:", str(e).splitlines()[0][:160])
    dense = []
    for _ in range(args.rounds):
        dense.append(cold_replay(lambda: F.linear(x, w)))
        for cfg in cands:
            cands[cfg].append(cold_replay(lambda: K.launch(A, x, out, cfg)))
    d = statistics.median(dense)
    print(f"{name} N=16 dense {d * 1e6:.1f} us")
    for cfg, ts in sorted(cands.items(), key=lambda kv: statistics.median(kv[1])):
        t = statistics.median(ts)
        tag = "BASE" if cfg in base else ""
        print(f"  {t * 1e6:6.1f} us  {d / t:4.2f}x  bm{cfg.bm} w{cfg.num_warps} wk{cfg.warps_k} ks{cfg.ksteps} st{cfg.stages} "
              f"cm{cfg.cluster_m} smem {K._mma_smem_bytes(cfg, False, 16, Kd) // 1024} KB {tag}")
        results.append({"shape": name, "config": str(cfg), "us": [t * 1e6 for t in ts], "dense_us": d * 1e6, "base": cfg in base})
json.dump(results, open(os.path.join(out_dir, "nm_n16_warps.json"), "w"), indent=1)
