"""Probe (session 18): what 2:4 decode at N = 16 pays for x. Every ring config with bn <= 16 is timed
at N = 16 and again at N = 1 with the same config (the same MMAs; x's ring rows past the first are
zero-filled, no L2 traffic). A gap that grows as bm shrinks says x's re-staging per row block binds.

    python benchmarks/experiments/n16_xcost.py [--shapes llama7b-up ...]
"""
from __future__ import annotations

import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem

SHAPES = {"llama7b-up": (11008, 4096), "llama7b-down": (4096, 11008), "llama13b-up": (13824, 5120), "llama70b-up": (28672, 8192)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES)[:3])
    ap.add_argument("--pattern", default="2:4")
    ap.add_argument("--bm", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--bn", type=int, nargs="+", default=[8, 16])
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "out")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    dtype = torch.float16
    for name in args.shapes:
        M, Kd = SHAPES[name]
        w = torch.randn(M, Kd, device="cuda", dtype=dtype)
        A = sparsify_weight(w, args.pattern)
        xs = {n: torch.randn(n, Kd, device="cuda", dtype=dtype) for n in (1, 16)}
        outs = {n: torch.empty(n, M, device="cuda", dtype=dtype) for n in (1, 16)}
        dense = cold_replay(lambda: F.linear(xs[16], w))
        prob = Problem("linear", A.signature, M, Kd, 16, "float16", A.stats(), device=device_name(0))
        for cfg in K.space(prob):
            if cfg.variant != "mma" or cfg.stages < 3 or cfg.x_whole or cfg.bn not in args.bn or cfg.bm not in args.bm:
                continue
            t = {}
            for n in (16, 1):
                K.launch(A, xs[n], outs[n], cfg)
                ref = F.linear(xs[n].double(), A.to_dense().double())
                err = ((outs[n].double() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (name, cfg, n, err)
                t[n] = cold_replay(lambda: K.launch(A, xs[n], outs[n], cfg)) * 1e6
            x_l2 = math.ceil(M / cfg.bm / cfg.cluster_m) * math.ceil(16 / cfg.bn) * Kd * cfg.bn * 2 / 1e6
            rows.append(dict(shape=name, cfg=str(cfg), bm=cfg.bm, bn=cfg.bn, warps=cfg.num_warps, wk=cfg.warps_k,
                             ks=cfg.ksteps, cm=cfg.cluster_m, t16=t[16], t1=t[1], dense=dense * 1e6, x_l2_mb=x_l2))
            print(f"{name} bm{cfg.bm} bn{cfg.bn} wn{K._warp_grid(cfg)[1]} w{cfg.num_warps} wk{cfg.warps_k} ks{cfg.ksteps} cm{cfg.cluster_m}: "
                  f"N16 {t[16]:.1f} us, same at N1 {t[1]:.1f} (x L2 {x_l2:.0f} MB)", flush=True)
    with open(os.path.join(out_dir, "n16_xcost.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\nshape | dense | best N16 (cfg) | its N1 | best N1-same over these")
    for name in args.shapes:
        r = [x for x in rows if x["shape"] == name]
        b16 = min(r, key=lambda x: x["t16"])
        b1 = min(r, key=lambda x: x["t1"])
        print(f"{name} | {b16['dense']:.1f} | {b16['t16']:.1f} (bm{b16['bm']} bn{b16['bn']} w{b16['warps']} "
              f"wk{b16['wk']} ks{b16['ks']} cm{b16['cm']}) | {b16['t1']:.1f} | {b1['t1']:.1f} (bm{b1['bm']} bn{b1['bn']} "
              f"w{b1['warps']} wk{b1['wk']}; its N16 {b1['t16']:.1f})")


if __name__ == "__main__":
    main()
