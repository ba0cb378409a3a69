"""Probe (session 17): short-M decode (7B down, 4096 x 11008) with more warps splitting K per CTA:
spmm_nm's ring configs beside extra (bm, warps, warps_k) shapes, 2:4 and 64:2:8, cold replays."""
import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from spartune.kernels import cuda  # noqa: E402
from spartune.kernels import spmm_nm as K  # noqa: E402
from spartune.prune import sparsify_weight  # noqa: E402
from spartune.tune.measure import cold_replay  # noqa: E402
from spartune.tune.problem import Problem  # noqa: E402

EXTRA = [(16, 8, 8), (32, 8, 4), (16, 8, 4), (32, 8, 8), (64, 8, 8)]
M, Kd = 4096, 11008
for pattern in ("2:4", "64:2:8"):
    g = torch.Generator(device="cuda").manual_seed(0)
    A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=g), pattern)
    w = A.to_dense()
    for N in (1, 16):
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=g)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        expect = x.double() @ w.double().T
        prob = Problem("linear", A.signature, M, Kd, N, "float16", A.stats(), device="H100 sm_90")
        base = [c for c in K.space(prob) if c.variant == "mma" and c.stages >= 3]
        extra = []
        for bm, warps, wk in EXTRA:
            for c in base:
                e = dataclasses.replace(c, bm=bm, num_warps=warps, warps_k=wk)
                if e not in base and e not in extra and K._warp_grid(e) is not None \
                        and K._mma_smem_bytes(e, pattern != "2:4", N, Kd) <= K.PIPE_SMEM:
                    extra.append(e)
        configs = base + extra
        cuda.precompile([i for c in configs for i in K.instances(prob, c)], x.device)
        dense = cold_replay(lambda: F.linear(x, w))
        rows = []
        for cfg in configs:
            K.launch(A, x, out, cfg)
            assert ((out.double() - expect).norm() / expect.norm()).item() < 1e-2, cfg
            rows.append((cold_replay(lambda: K.launch(A, x, out, cfg)), cfg))
        rows.sort(key=lambda r: r[0])
        print(f"{pattern} N={N}: dense {dense * 1e6:.1f} us, {len(base)} + {len(extra)} configs", flush=True)
        for t, c in rows[:6]:
            print(f"   {t * 1e6:6.1f} us ({dense / t:.2f}x)  bm {c.bm} bn {c.bn} warps {c.num_warps} wk {c.warps_k} "
                  f"ks {c.ksteps} xw {c.x_whole}{'  NEW' if c in extra else ''}", flush=True)
