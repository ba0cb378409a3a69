"""V:N:M prefill: x^T's kept rows gathered by TMA boxes (64 tokens x 1 row) against cp.async
(session 31). Every V:N:M wgmma config of the space, both ways; each output checked against the
float64 reference; cold replays; cuBLAS and the as_24 best beside. fp16, N = 2048.
Run: PYTHONPATH=$PWD python benchmarks/experiments/gather_tma_probe.py  (writes $OUT/gather_tma_probe.json)"""
import dataclasses
import json
import os
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_nm as K
from spartune.tune.measure import cold_replay

N = int(os.environ.get("N", 2048))
SHAPES = {"7b_up": (11008, 4096), "7b_down": (4096, 11008)}
PATTERNS = sys.argv[1:] or ["64:2:8", "128:2:8", "64:2:16"]
res = {}
torch.manual_seed(0)
for pattern in PATTERNS:
    for name, (m, k) in SHAPES.items():
        w = torch.randn(m, k, device="cuda", dtype=torch.float16)
        A = st.sparsify_weight(w, pattern)
        x = torch.randn(N, k, device="cuda", dtype=torch.float16)
        ref = (x.double() @ A.to_dense().double().T)
        prob = dispatch.linear_problem(A, N, "float16")
        space = K.space(prob)
        plain = [c for c in space if c.variant == "wgmma" and not c.as_24]
        row = {"cublas": cold_replay(lambda: F.linear(x, w)) * 1e6}
        best24 = min((cold_replay(lambda c=c: K.launch(A, x, torch.empty(N, m, device="cuda", dtype=torch.float16), c)) * 1e6, str(c))
                     for c in [c for c in space if c.as_24][:6])
        row["as_24_best"] = best24
        for tma in (False, True):
            times = []
            for c in plain:
                c = dataclasses.replace(c, gather_tma=tma)
                out = torch.full((N, m), float("nan"), device="cuda", dtype=torch.float16)
                K.launch(A, x, out, c)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    print("WRONG", pattern, name, c, err, flush=True)
                    times.append((float("inf"), str(c), err))
                    continue
                times.append((cold_replay(lambda c=c, out=out: K.launch(A, x, out, c)) * 1e6, str(c), err))
            times.sort()
            row["tma" if tma else "cp_async"] = times
        res[f"{pattern} {name}"] = row
        cb, ca, tm = row["cublas"], row["cp_async"][0][0], row["tma"][0][0]
        print(f"{pattern} {name}: cuBLAS {cb:.1f} us, as_24 {best24[0]:.1f}, cp.async best {ca:.1f} ({cb / ca:.2f}x), "
              f"TMA best {tm:.1f} ({cb / tm:.2f}x); {row['tma'][0][1]}", flush=True)
        json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "gather_tma_probe.json"), "w"), indent=1)
