"""Probe (issue 16, session 19): one csr_smem launch for ncu, 90% fp16, e.g.
    ncu --kernel-name spmm_csr_smem -c 1 ... python benchmarks/experiments/csr_ncu.py M K N nt ks warps gpw qs kw ck
"""
import sys

import torch

import spartune as st
from spartune.kernels import spmm_csr_smem as K

M, Kd, N, nt, ks, warps, gpw, qs, kw, ck = map(int, sys.argv[1:11])
g = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=g)
w = w * (torch.rand(M, Kd, device="cuda", generator=g) < 0.1)
A = st.CSR.from_dense(w)
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
cfg = K.Config(nt, ks, warps, gpw, qs, kw, ck)
K.launch(A, x, out, cfg)
torch.cuda.synchronize()
K.launch(A, x, out, cfg)
torch.cuda.synchronize()
