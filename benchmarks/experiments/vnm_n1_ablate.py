"""Probe (session 35): 64:2:8's N = 1 picks (x_whole ring): GATHER 3 (each chunk's k-major x tile
of 8 tokens filled from the staged row) against GATHER 4 (one token's row of kept columns, the B
fragment by one 16-byte load), cold_replay in turns with cuBLAS; every output checked."""
import json
import os

import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay, rotated_replay

PICKS = {"7b-up": (11008, 4096, dict(bm=32, bn=8, num_warps=4, warps_k=2)),
         "7b-down": (4096, 11008, dict(bm=32, bn=8, num_warps=16, warps_k=8)),
         "13b-up": (13824, 5120, dict(bm=32, bn=8, num_warps=4, warps_k=2)),
         "70b-up": (28672, 8192, dict(bm=64, bn=8, num_warps=4, warps_k=1))}
_gather = K.mma_gather
MODE = {"g": 4}
K.mma_gather = lambda config, n=0: 3 if MODE["g"] == 3 and _gather(config, n) == 4 else _gather(config, n)
rows = []
for name, (M, Kd, c) in PICKS.items():
    cfg = K.Config(**c, ksteps=4, variant="mma", stages=3, x_whole=True)
    torch.manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "64:2:8")
    x = torch.randn(1, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(1, M, device="cuda", dtype=torch.float16)
    ref = x.double() @ A.to_dense().double().T
    times = {"dense": [], "g3": [], "g4": []}
    for rnd in range(3):
        times["dense"].append(cold_replay(lambda: torch.nn.functional.linear(x, w)))
        for mode in ("g3", "g4"):
            MODE["g"] = int(mode[1])
            K._kernels.clear()
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, mode, err)
            times[mode].append(cold_replay(lambda: K.launch(A, x, out, cfg)))
    rot = {}
    for mode in ("g3", "g4"):
        MODE["g"] = int(mode[1])
        K._kernels.clear()
        rot[mode] = rotated_replay(lambda A: K.launch(A, x, out, cfg), A, A.nbytes)
    rot["dense"] = rotated_replay(lambda w: torch.nn.functional.linear(x, w), w, w.numel() * 2)
    med = {k: sorted(v)[1] for k, v in times.items()}
    rows.append(dict(shape=name, **{f"{k}_s": v for k, v in med.items()}, **{f"{k}_rot_s": v for k, v in rot.items()}))
    print(f"{name:8} cuBLAS {med['dense']*1e6:6.1f}  g3 {med['g3']*1e6:6.1f} ({med['dense']/med['g3']:.2f}x)  "
          f"g4 {med['g4']*1e6:6.1f} ({med['dense']/med['g4']:.2f}x) | rotated cuBLAS {rot['dense']*1e6:6.1f} "
          f"g3 {rot['g3']*1e6:6.1f} ({rot['dense']/rot['g3']:.2f}x) g4 {rot['g4']*1e6:6.1f} ({rot['dense']/rot['g4']:.2f}x)",
          flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, "vnm_n1_gather4.json"), "w"), indent=1)
