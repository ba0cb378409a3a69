"""Probe (session 17): V:N:M decode at N = 1, every ring config of spmm_nm's space and the
x_whole twin of each (also those past the space's 112 KB budget), cold graph replays; 64:2:8."""
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

SHAPES = {"7b-down": (4096, 11008), "7b-up": (11008, 4096), "13b-up": (13824, 5120)}
N = int(os.environ.get("N", "1"))
for name, (M, Kd) in SHAPES.items():
    g = torch.Generator(device="cuda").manual_seed(0)
    A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=g), "64:2:8")
    w = A.to_dense()
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=g)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    expect = x.double() @ w.double().T
    prob = Problem("linear", A.signature, M, Kd, N, "float16", A.stats(), device="H100 sm_90")
    ring = [c for c in K.space(prob) if c.stages >= 3 and not c.x_whole]
    configs = ring + [dataclasses.replace(c, x_whole=True) for c in ring]
    cuda.precompile([i for c in configs for i in K.instances(prob, c)], x.device)
    dense = cold_replay(lambda: F.linear(x, w))
    rows = []
    for cfg in configs:
        smem = K._mma_smem_bytes(cfg, True, N, Kd)
        if smem > 227 * 1024:
            continue
        K.launch(A, x, out, cfg)
        assert ((out.double() - expect).norm() / expect.norm()).item() < 1e-2, cfg
        rows.append((cold_replay(lambda: K.launch(A, x, out, cfg)), cfg, smem))
    rows.sort(key=lambda r: r[0])
    print(f"{name} N={N}: dense {dense * 1e6:.1f} us", flush=True)
    for t, c, smem in rows[:8]:
        print(f"   {t * 1e6:6.1f} us ({dense / t:.2f}x)  bm {c.bm} bn {c.bn} warps {c.num_warps} wk {c.warps_k} "
              f"ks {c.ksteps} x_whole {c.x_whole}  smem {smem // 1024} KB", flush=True)
