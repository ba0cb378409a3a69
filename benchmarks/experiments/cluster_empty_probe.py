"""Probe (session 33): spmm_nm decode clusters with per-stage `empty` mbarriers (CLUSTER_EMPTY 1:
only warp 0, which issues the CTA's x copies, waits for the cluster's warps to free a stage)
against the cluster barrier every chunk (CLUSTER_EMPTY 0), the tuned cluster picks, cold replays in
turns with cuBLAS: python cluster_empty_probe.py [--rounds 5] [--dtype float16]."""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.kernels.cuda import compiler
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

C = K.Config
CASES = [("llama7b-down", 4096, 11008, 16, C(32, 16, 16, 8, 4, stages=3, cluster_m=2)),
         ("llama7b-down", 4096, 11008, 8, C(32, 8, 16, 8, 4, stages=3, cluster_m=2)),
         ("llama7b-up", 11008, 4096, 16, C(32, 16, 8, 2, 4, stages=3, cluster_m=4)),
         ("llama13b-up", 13824, 5120, 16, C(32, 16, 4, 2, 4, stages=3, cluster_m=4)),
         ("llama70b-up", 28672, 8192, 16, C(32, 16, 4, 2, 4, stages=3, cluster_m=2))]

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--dtype", default="float16")
args = ap.parse_args()
dtype = getattr(torch, args.dtype)
plain_instance = K._instance


def bind(mode, A, x, out, cfg):
    def instance(*a, **kw):
        inst = plain_instance(*a, **kw)
        return compiler.instance(inst.template, inst.kernel, {**dict(inst.defines), "CLUSTER_EMPTY": mode},
                                 arch_specific=inst.arch_specific, **dict(inst.options))
    K._instance, saved = instance, dict(K._kernels)
    K._kernels.clear()
    try:
        run = K.bind(A, x, out, cfg)
    finally:
        K._instance = plain_instance
        K._kernels.clear()
        K._kernels.update(saved)
    return run


results = []
for name, M, Kd, N, cfg in CASES:
    torch.manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=dtype)
    A = sparsify_weight(w, "2:4")
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    out = torch.empty(N, M, device="cuda", dtype=dtype)
    ref = F.linear(x.double(), A.to_dense().double())
    runs = {m: bind(m, A, x, out, cfg) for m in (0, 1)}
    for m, run in runs.items():
        out.fill_(float("nan"))
        run(x, out, None, None)
        torch.cuda.synchronize()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert not out.isnan().any() and err < 1e-2, (name, N, m, err)
    times = {"dense": [], 0: [], 1: []}
    for _ in range(args.rounds):
        times["dense"].append(cold_replay(lambda: F.linear(x, w)))
        for m, run in runs.items():
            times[m].append(cold_replay(lambda: run(x, out, None, None)))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(f"{name:13s} N={N:2d} cm{cfg.cluster_m}: dense {med['dense']:6.1f}  barrier {med[0]:6.1f} "
          f"({med['dense'] / med[0]:4.2f}x)  empty {med[1]:6.1f} ({med['dense'] / med[1]:4.2f}x)  "
          f"{(med[1] / med[0] - 1) * 100:+5.1f}%", flush=True)
    results.append({"shape": name, "n": N, "config": str(cfg), "dtype": args.dtype,
                    "us": {str(k): [t * 1e6 for t in v] for k, v in times.items()}})
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(results, open(os.path.join(out_dir, f"cluster_empty_probe_{args.dtype}.json"), "w"), indent=1)
