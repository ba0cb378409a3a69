"""One csr_bitmap launch for ncu (session 24): SHAPE=7b-up N=16 DENSITY=0.1 CFG=16,16,16,1 (nt, kp, warps, pf).

    ncu --set full -k spmm_csr_bitmap -c 1 python benchmarks/experiments/csr_bitmap_ncu.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import spartune as st  # noqa: E402
from spartune.kernels import spmm_csr_bitmap as B  # noqa: E402

SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
M, K = SHAPES[os.environ.get("SHAPE", "7b-up")]
N = int(os.environ.get("N", "16"))
density = float(os.environ.get("DENSITY", "0.1"))
cfg = B.Config(*[int(v) for v in os.environ.get("CFG", "16,16,16,1").split(",")])
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
w = w * (torch.rand(M, K, device="cuda", generator=gen) < density)
A = st.CSR.from_dense(w)
x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
B.launch(A, x, out, cfg)
torch.cuda.synchronize()
print("err", ((out.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()).item())
