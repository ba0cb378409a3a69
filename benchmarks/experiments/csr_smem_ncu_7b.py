"""ncu of csr_smem's tuned picks on Llama-7B up and down at N = 8, 90% (session 24): why the same
bytes take 2.4 us longer on down. Two warm-up launches, then one launch of each:

    ncu --set full --launch-skip 2 --launch-count 2 -k spmm_csr_smem python benchmarks/experiments/csr_smem_ncu_7b.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import spartune as st  # noqa: E402
from spartune.kernels import spmm_csr_smem as K  # noqa: E402

gen = torch.Generator(device="cuda").manual_seed(0)
cases = []
for M, Kd, cfg in ((11008, 4096, K.Config(8, 4096, 24, 1, 1, 8)), (4096, 11008, K.Config(8, 3680, 24, 1, 1, 8))):
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    x = torch.randn(8, Kd, device="cuda", dtype=torch.float16, generator=gen)
    cases.append((A, x, torch.empty(8, M, device="cuda", dtype=torch.float16), cfg))
for A, x, out, cfg in cases:
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
for A, x, out, cfg in cases:
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
