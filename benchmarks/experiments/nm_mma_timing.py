"""Probe: the mma.sp variant of spmm_nm (2:4 decode; V:N:M decode and prefill) against cuBLAS,
best config of the space per problem, L2 flushed, with a float64 check on the way.
  python benchmarks/experiments/nm_mma_timing.py [--bf16] [--decode]"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_nm as K
from spartune.tune.device import device_name
from spartune.tune.measure import time_callable
from spartune.tune.problem import Problem

dtype = torch.bfloat16 if "--bf16" in sys.argv else torch.float16
shapes = [(11008, 4096), (4096, 11008), (13824, 5120), (28672, 8192)]
cases = [("2:4", 1), ("2:4", 16), ("64:2:8", 1), ("64:2:8", 16), ("64:2:8", 2048), ("128:2:8", 16),
         ("128:2:8", 2048), ("64:2:16", 16), ("64:2:16", 2048)]
if "--decode" in sys.argv:
    cases = [c for c in cases if c[1] <= 16]
rows = []
for (M, Kd) in shapes:
    g = torch.Generator(device="cuda").manual_seed(M + Kd)
    w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=g)
    for pattern, N in cases:
        A = st.sparsify_weight(w, pattern)
        d = A.to_dense()
        x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=g)
        out = torch.empty(N, M, device="cuda", dtype=dtype)
        ref = x.double() @ d.double().T
        prob = Problem("linear", A.signature, M, Kd, N, str(dtype).split(".")[-1], A.stats(), device=device_name())
        t_dense = time_callable(lambda: F.linear(x, d))
        best = None
        for cfg in [c for c in K.space(prob) if c.variant == "mma"]:
            K.launch(A, x, out, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (pattern, N, cfg, err)
            t = time_callable(lambda: K.launch(A, x, out, cfg))
            if best is None or t < best[0]:
                best = (t, cfg)
        t, cfg = best
        print(f"{M}x{Kd} {pattern:8s} N={N:5d}: dense {t_dense*1e6:8.1f} us, ours {t*1e6:8.1f} us -> {t_dense/t:5.2f}x "
              f"(bm={cfg.bm} bn={cfg.bn} w={cfg.num_warps} wk={cfg.warps_k} ks={cfg.ksteps})", flush=True)
        rows.append(dict(M=M, K=Kd, pattern=pattern, N=N, dense_us=t_dense * 1e6, ours_us=t * 1e6, cfg=str(cfg)))
with open(os.path.join(os.environ.get("OUT", "."), f"nm_mma_timing_{str(dtype).split('.')[-1]}.json"), "w") as f:
    json.dump(rows, f, indent=1)
