"""Probe (session 16): 2:4 prefill, 256 x 192 tiles beside the 128 x 256 / 256 x 128 ones and
cuBLAS, fp16, L2 flushed; every output checked."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_nm_decode import SHAPES, seconds  # noqa: E402
from spartune.kernels import spmm_nm as K  # noqa: E402
from spartune.prune import sparsify_weight  # noqa: E402

CONFIGS = [K.Config(bm, bn, 12, variant="wgmma", stages=st, group_m=g, cluster_m=cm)
           for bm, bn, st in ((128, 256, 5), (256, 192, 4)) for cm in (1, 2) for g in (8, 16)]
CONFIGS.append(K.Config(256, 128, 12, variant="wgmma", stages=5, group_m=8))
if sys.argv[1:] == ["ncu"]:  # one launch of each kind (7B up, N = 2048) for ncu's warp-state sections
    M, Kd = SHAPES["llama7b-up"]
    A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), "2:4")
    x = torch.randn(2048, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(2048, M, device="cuda", dtype=torch.float16)
    for cfg in (CONFIGS[0], CONFIGS[4]):
        K.launch(A, x, out, cfg)
        torch.cuda.synchronize()
    sys.exit()
rows = []
ns = [int(a) for a in sys.argv[1:]] or [2048, 8192]
for name in ("llama7b-up", "llama7b-down", "llama13b-up", "llama70b-up"):
    M, Kd = SHAPES[name]
    for N in ns:
        if name == "llama70b-up" and N == 8192 and len(ns) > 1:
            continue
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = sparsify_weight(w, "2:4")
        wd = A.to_dense()
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        expect = x.float() @ wd.float().T
        row = dict(shape=name, N=N, dense_us=seconds(lambda: F.linear(x, wd)) * 1e6, configs={})
        for cfg in CONFIGS:
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.float() - expect).norm() / expect.norm()).item()
            t = seconds(lambda: K.launch(A, x, out, cfg)) * 1e6
            row["configs"][f"{cfg.bm}x{cfg.bn} st{cfg.stages} c{cfg.cluster_m} g{cfg.group_m} w{cfg.num_warps}"] = (round(t, 1), err)
        rows.append(row)
        best = {}
        for k, (t, err) in row["configs"].items():
            assert err < 1e-2, (name, N, k, err)
            tile = " ".join(k.split()[:2])
            best[tile] = min(best.get(tile, (1e9, "")), (t, k))
        print(name, N, f"dense {row['dense_us']:.1f}", " | ".join(f"{k} {t:.1f} ({row['dense_us'] / t:.2f}x)" for t, k in best.values()), flush=True)
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "out"), "wgmma_tiles.json"), "w"), indent=1)
