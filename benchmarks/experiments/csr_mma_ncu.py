"""One csr_mma launch for ncu (7B up, N = 16, 90%, fp16): python csr_mma_ncu.py STAGES OCC WN"""
import sys
import torch
import spartune as st
from spartune.kernels import spmm_csr_mma as K
stg, occ, wn = (int(a) for a in sys.argv[1:4])
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(11008, 4096, device="cuda", dtype=torch.float16, generator=gen)
w = w * (torch.rand(11008, 4096, device="cuda", generator=gen) < 0.1)
A = st.CSR.from_dense(w)
x = torch.randn(16, 4096, device="cuda", dtype=torch.float16, generator=gen)
out = torch.empty(16, 11008, device="cuda", dtype=torch.float16)
cfg = K.Config(128, 16, 8, wn, stg, occ)
for _ in range(3):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
