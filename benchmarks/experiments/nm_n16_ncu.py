"""Probe (session 26, lead 1 of session 18): one spmm_nm launch of a 2:4 decode config on Llama-7B
down for ncu's source view (the first launches compile and warm; profile with --launch-skip 2 -c 1):

    ncu --set full --import-source no -k spmm_nm --launch-skip 2 -c 1 -o out/pick16 \
        python benchmarks/experiments/nm_n16_ncu.py pick16
"""
import sys

import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

C = K.Config
CASES = {  # name: (N, config)
    "pick16": (16, C(32, 16, 8, 4, 4, stages=3, cluster_m=2)),   # the tuned N = 16 pick (session 18)
    "plain16": (16, C(32, 16, 8, 4, 4, stages=3)),               # the same without its cluster
    "plain1": (1, C(32, 16, 8, 4, 4, stages=3)),                 # the same at N = 1
    "pick1": (1, C(16, 8, 8, 8, 4, stages=3)),                   # the N = 1 pick
}
M, Kd = 4096, 11008
N, cfg = CASES[sys.argv[1]]
torch.manual_seed(0)
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
A = sparsify_weight(w, "2:4")
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
for _ in range(3):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
ref = torch.nn.functional.linear(x.double(), A.to_dense().double())
print(sys.argv[1], "rel err", ((out.double() - ref).norm() / ref.norm()).item())
