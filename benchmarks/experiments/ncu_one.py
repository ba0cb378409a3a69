"""Probe (session 21): one launch of a tuned csr_smem config for ncu (benchmarks/experiments/
stage_probe.py's CASES): python ncu_one.py CASE DTYPE."""
import sys

import torch

import spartune as st
from spartune.kernels import spmm_csr_smem as K
from stage_probe import CASES

case, dtype = sys.argv[1], getattr(torch, sys.argv[2])
(M, Kd), cfg = CASES[case]
N = int(case.split(":")[1])
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
A = st.CSR.from_dense(w)
x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
out = torch.empty(N, M, device="cuda", dtype=dtype)
for _ in range(3):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
