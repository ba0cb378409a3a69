"""Probe: one launch of the wgmma variant for ncu (11008x4096 or 4096x11008, N = 2048, fp16).
  ncu --section SpeedOfLight ... -k regex:spmm_nm_wgmma -c 1 python benchmarks/experiments/nm_wgmma_profile.py M K BM BN G [--time]"""
import sys

import torch

import spartune as st
from spartune.kernels import spmm_nm as K

M, Kd, bm, bn, g = (int(a) for a in sys.argv[1:6])
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
keep = torch.rand(M, Kd // 4, 4, device="cuda").argsort(-1)[..., :2]
mask = torch.zeros(M, Kd // 4, 4, device="cuda", dtype=torch.bool).scatter_(-1, keep, True)
A = st.NM.from_dense((w.view(M, Kd // 4, 4) * mask).view(M, Kd), 2, 4)
x = torch.randn(2048, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(2048, M, device="cuda", dtype=torch.float16)
cfg = K.Config(bm, bn, 12, variant="wgmma", stages=4, group_m=g)
K.packed_wgmma(A, bm)
torch.cuda.synchronize()
K.launch(A, x, out, cfg)
torch.cuda.synchronize()
if "--time" in sys.argv:
    from spartune.tune.measure import time_callable

    print(f"{cfg}: {time_callable(lambda: K.launch(A, x, out, cfg)) * 1e6:.1f} us")
