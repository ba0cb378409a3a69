"""Probe (session 25): one csr_smem launch of a tuned N = 8 pick for ncu (the first launch compiles
and warms; profile with --launch-skip 1 -c 1):

    ncu --set full --import-source no -k spmm_csr_smem --launch-skip 1 -c 1 -o out/qkv \
        python benchmarks/experiments/ncu_csr_smem_one.py qkv
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import spartune as st  # noqa: E402
from spartune.kernels import spmm_csr_smem as K  # noqa: E402

C = K.Config
CASES = {
    "qkv": (4096, 4096, 8, 0.1, C(8, 4096, 16, 1, 1, 16)),
    "7b-down": (4096, 11008, 8, 0.1, C(8, 3680, 24, 1, 1, 8)),
    "7b-up": (11008, 4096, 8, 0.1, C(8, 4096, 24, 1, 1, 8)),
}
M, Kd, N, density, cfg = CASES[sys.argv[1]]
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < density)
A = st.CSR.from_dense(w)
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
for _ in range(2):
    K.launch(A, x, out, cfg)
    torch.cuda.synchronize()
