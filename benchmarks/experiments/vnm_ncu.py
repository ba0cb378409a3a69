"""Probe: ncu on the V:N:M and 2:4 decode kernels of Llama-70B up at N = 1, one config (why V:N:M's
ring streams at ~2.1 TB/s where 2:4's reaches 2.66). Run under ncu (benchmarks/LOG.md has the command)."""
import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

M, Kd = 28672, 8192
x = torch.randn(1, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(1, M, device="cuda", dtype=torch.float16)
for pattern in ("64:2:8", "2:4"):
    A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), pattern)
    K.launch(A, x, out, K.Config(64, 8, 4, 1, 4, stages=3))
    torch.cuda.synchronize()
