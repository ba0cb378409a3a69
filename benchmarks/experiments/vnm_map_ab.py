"""Probe (session 35): V:N:M's column map as int32 column indices (spmm_nm_i32.cu, a copy of the
kernel reading the old map) against the format's byte offsets (spmm_nm.cu), same configs, GATHER
3 and 4, cold_replay in turns with cuBLAS, outputs checked."""
import json
import os

import torch

from spartune.kernels import cuda, spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

PICKS = {"7b-up": (11008, 4096, dict(bm=32, bn=8, num_warps=4, warps_k=2)),
         "7b-down": (4096, 11008, dict(bm=32, bn=8, num_warps=16, warps_k=8)),
         "13b-up": (13824, 5120, dict(bm=32, bn=8, num_warps=4, warps_k=2)),
         "70b-up": (28672, 8192, dict(bm=64, bn=8, num_warps=4, warps_k=1))}
_gather, _inst, _offsets = K.mma_gather, K._instance, K.column_offsets
MODE = {"g": 4, "map": "u8"}
K.mma_gather = lambda config, n=0: 3 if MODE["g"] == 3 and _gather(config, n) == 4 else _gather(config, n)


def inst(*a, **k):
    i = _inst(*a, **k)
    return cuda.instance("spmm_nm_i32.cu", i.kernel, dict(i.defines), arch_specific=i.arch_specific) \
        if MODE["map"] == "i32" and i.template == "spmm_nm.cu" else i


K._instance = inst
K.column_offsets = lambda A: K.column_map(A) if MODE["map"] == "i32" else _offsets(A)
rows = []
for name, (M, Kd, c) in PICKS.items():
    cfg = K.Config(**c, ksteps=4, variant="mma", stages=3, x_whole=True)
    torch.manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "64:2:8")
    x = torch.randn(1, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(1, M, device="cuda", dtype=torch.float16)
    ref = x.double() @ A.to_dense().double().T
    modes = [(g, m) for g in (3, 4) for m in ("i32", "u8")]
    times = {"dense": [], **{f"g{g}_{m}": [] for g, m in modes}}
    for rnd in range(3):
        times["dense"].append(cold_replay(lambda: torch.nn.functional.linear(x, w)))
        for g, m in modes:
            MODE.update(g=g, map=m)
            K._kernels.clear()
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, g, m, err)
            times[f"g{g}_{m}"].append(cold_replay(lambda: K.launch(A, x, out, cfg)))
    med = {k: sorted(v)[1] for k, v in times.items()}
    rows.append(dict(shape=name, **{f"{k}_s": v for k, v in med.items()}))
    print(f"{name:8} " + "  ".join(f"{k} {v*1e6:6.1f}" for k, v in med.items()), flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, "vnm_map_ab.json"), "w"), indent=1)
