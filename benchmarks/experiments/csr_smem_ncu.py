"""Probe: one csr_smem launch for ncu (Llama-70B up, 90%, fp16).
    ncu --kernel-name spmm_csr_smem --launch-skip 2 --launch-count 1 python benchmarks/experiments/csr_smem_ncu.py N NT KS WARPS GPW"""
import sys

import torch

import spartune as st
from spartune.kernels import spmm_csr_smem as K

N, nt, ks, warps, gpw = (int(v) for v in sys.argv[1:6])
M, Kd = (int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else (28672, 8192)
g = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=g)
w = w * (torch.rand(M, Kd, device="cuda", generator=g) < 0.1)
A = st.CSR.from_dense(w)
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=g)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
cfg = K.Config(nt, ks, warps, gpw)
for _ in range(4):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
print("registers", K._kernel(cfg, torch.float16, x.device).registers)
