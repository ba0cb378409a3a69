"""Probe: what the called epilogue (GELU / SiLU / residual through store_called) costs the mma
variant against the inline light one, at decode and at a mid N: one config each, graph-replayed
with the L2 evicted."""
import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

M, Kd = 11008, 4096
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
A = sparsify_weight(w, "2:4")
bias = torch.randn(M, device="cuda", dtype=torch.float16)
for n, cfg in ((1, K.Config(32, 8, 4, 2, 4, stages=3)), (16, K.Config(64, 16, 4, 2, 4, stages=3)),
               (32, K.Config(64, 32, 4, 1, 4)), (128, K.Config(128, 128, 8, 1, 4))):
    x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(n, M, device="cuda", dtype=torch.float16)
    res = torch.randn(n, M, device="cuda", dtype=torch.float16)
    times = {}
    for name, epi in (("plain", {}), ("bias+relu", dict(bias=bias, activation="relu")),
                      ("bias+gelu", dict(bias=bias, activation="gelu")), ("silu+residual", dict(activation="silu", residual=res))):
        K.launch(A, x, out, cfg, **epi)
        times[name] = cold_replay(lambda: K.launch(A, x, out, cfg, **epi))
    print(f"N={n:4d} " + "  ".join(f"{k} {v * 1e6:.1f} us" for k, v in times.items()))
