"""Probe (session 27): 2:4 decode at N = 16. (1) What x's traffic costs the tuned picks: each pick
beside itself compiled with ABLATE_X (no x copies: timing only). (2) Taller row blocks shared by a
cluster (bm 48/64, cm 2/4: x's L2 copies 1/2-1/4 of the pick's) on 7B down. Cold replays in turns:
python nm_n16_rows.py [--rounds 3] [--shapes ...]."""
import argparse
import dataclasses
import json
import os
import statistics

import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

C = K.Config
PICKS = {"llama7b-down": ((4096, 11008), C(32, 16, 16, 8, 4, stages=3, cluster_m=2)),
         "llama7b-up": ((11008, 4096), C(32, 16, 8, 2, 4, stages=3, cluster_m=4)),
         "llama13b-up": ((13824, 5120), C(32, 16, 4, 2, 4, stages=3, cluster_m=4))}
TALL = [C(64, 16, 16, 4, 4, stages=3, cluster_m=m) for m in (1, 2, 4)] \
    + [C(64, 16, 16, 8, 2, stages=s, cluster_m=m) for s in (3, 4) for m in (2, 4)] \
    + [C(64, 16, 8, 2, 4, stages=3, cluster_m=m) for m in (2, 4)] \
    + [C(48, 16, 12, 4, 4, stages=s, cluster_m=m) for s in (3, 4) for m in (2, 4)] \
    + [C(48, 16, 24, 8, 2, stages=3, cluster_m=m) for m in (2, 4)]
# second run (--tall48): row blocks of 48 in clusters of 3 and 4, stages and K steps
TALL48 = [C(48, 16, 12, 4, 4, stages=4, cluster_m=m) for m in (2, 3, 4)] \
    + [C(48, 16, 12, 4, 2, stages=s, cluster_m=m) for s in (5, 6) for m in (3, 4)] \
    + [C(48, 16, 24, 8, 2, stages=4, cluster_m=m) for m in (3, 4)] \
    + [C(48, 16, 24, 4, 4, stages=4, cluster_m=m) for m in (3, 4)]
ABLATED_TOO = [C(48, 16, 12, 4, 4, stages=4, cluster_m=4)]

orig_instance, plain_kernels, ablated_kernels = K._instance, K._kernels, {}


def ablated(config, dtype, gather=0, act=0):
    inst = orig_instance(config, dtype, gather, act)
    return dataclasses.replace(inst, defines=tuple(sorted(inst.defines + (("ABLATE_X", 1),))))


def run(A, x, out, cfg, ablate):
    K._instance = ablated if ablate else orig_instance
    K._kernels = ablated_kernels if ablate else plain_kernels
    try:
        K.launch(A, x, out, cfg)
    finally:
        K._instance, K._kernels = orig_instance, plain_kernels


ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--shapes", nargs="+", default=list(PICKS))
ap.add_argument("--tall48", action="store_true", help="the second run's set (7B down only)")
args = ap.parse_args()
out_dir = os.environ.get("OUT", "out")
results = []
for name in args.shapes:
    (M, Kd), pick = PICKS[name]
    torch.manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "2:4")
    x = torch.randn(16, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(16, M, device="cuda", dtype=torch.float16)
    ref = F.linear(x.double(), A.to_dense().double())
    cands = {}
    tall = (TALL48 if args.tall48 else TALL) if name == "llama7b-down" else []
    for cfg, abl in [(pick, False), (pick, True)] + [(c, False) for c in tall] \
            + [(c, True) for c in ABLATED_TOO if args.tall48 and c in tall]:
        try:
            out.fill_(float("nan"))
            run(A, x, out, cfg, abl)
            torch.cuda.synchronize()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if not abl and not err < 1e-2:
                print(name, cfg, "WRONG", err)
                continue
            cands[(cfg, abl)] = []
        except Exception as e:  # noqa: BLE001
            print(name, cfg, "failed:", str(e).splitlines()[0][:160])
    dense = []
    for _ in range(args.rounds):
        dense.append(cold_replay(lambda: F.linear(x, w)))
        for (cfg, abl) in cands:
            cands[(cfg, abl)].append(cold_replay(lambda: run(A, x, out, cfg, abl)))
    d = statistics.median(dense)
    print(f"{name} N=16 dense {d * 1e6:.1f} us")
    for (cfg, abl), ts in sorted(cands.items(), key=lambda kv: statistics.median(kv[1])):
        t = statistics.median(ts)
        tag = ("PICK" if cfg == pick else "") + (" NO-X" if abl else "")
        print(f"  {t * 1e6:6.1f} us  {d / t:4.2f}x  bm{cfg.bm} w{cfg.num_warps} wk{cfg.warps_k} ks{cfg.ksteps} st{cfg.stages} "
              f"cm{cfg.cluster_m} smem {K._mma_smem_bytes(cfg, False, 16, Kd) // 1024} KB {tag}")
        results.append({"shape": name, "config": str(cfg), "ablate_x": abl, "us": [t * 1e6 for t in ts],
                        "dense_us": d * 1e6})
json.dump(results, open(os.path.join(out_dir, "nm_n16_rows%s.json" % ("_48" if args.tall48 else "")), "w"), indent=1)
