"""Probe (session 35): 64:2:8 at N = 1, the tuned picks (x_whole ring), launched for ncu.
    ncu -k regex:spmm_nm --launch-skip 3 --launch-count 1 ... python ncu_vnm_n1.py SHAPE"""
import sys

import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

SHAPES = {"7b-down": (4096, 11008, dict(bm=32, bn=8, num_warps=16, warps_k=8)),
          "7b-up": (11008, 4096, dict(bm=32, bn=8, num_warps=4, warps_k=2))}
M, Kd, c = SHAPES[sys.argv[1]]
cfg = K.Config(**c, ksteps=4, variant="mma", stages=3, x_whole=True)
torch.manual_seed(0)
A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), "64:2:8")
x = torch.randn(1, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(1, M, device="cuda", dtype=torch.float16)
for _ in range(5):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
ref = x.double() @ A.to_dense().double().T
print("err", ((out.double() - ref).norm() / ref.norm()).item())
