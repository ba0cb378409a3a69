"""Probe for ncu (issue 16): launches one csr_smem config a few times on one case.
    ncu --clock-control none -k regex:spmm_csr_smem --launch-skip 2 --launch-count 1 \
        python benchmarks/experiments/csr_smem_ncu.py 4096 4096 8 "8,4096,16,1,1,16" """
import sys

import torch

import spartune as st
from spartune.kernels import spmm_csr_smem as K

M, Kd, N = (int(v) for v in sys.argv[1:4])
cfg = K.Config(*(int(v) for v in sys.argv[4].split(",")))
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
A = st.CSR.from_dense(w)
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
for _ in range(4):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
print("err", ((out.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()).item())
