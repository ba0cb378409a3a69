"""Probe (session 18): one 2:4 decode launch on 7B down for ncu, e.g.
    ncu --kernel-name spmm_nm -c 1 --section SpeedOfLight ... python benchmarks/experiments/n16_ncu.py N bm bn warps wk ks cm
"""
import sys

import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

N, bm, bn, warps, wk, ks, cm = map(int, sys.argv[1:8])
M, Kd = 4096, 11008
A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), "2:4")
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
K.launch(A, x, out, K.Config(bm, bn, warps, wk, ks, stages=3, cluster_m=cm))
torch.cuda.synchronize()
