"""Probe (session 30): V:N:M decode with an int16 column map (SPARTUNE_MAP16) against int32: the
tuned 64:2:8 call, cold, at N = 1 and 16 on the Llama shapes; run once per tree (PYTHONPATH)."""
import json
import os
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.tune.measure import cold_replay

torch.manual_seed(0)
tree = sys.argv[1]
for name, M, K in (("7b-up", 11008, 4096), ("7b-down", 4096, 11008), ("13b-up", 13824, 5120), ("70b-up", 28672, 8192)):
    w = torch.randn(M, K, device="cuda", dtype=torch.float16)
    A = st.sparsify_weight(w, "64:2:8")
    wd = A.to_dense()
    for N in (1, 16):
        x = torch.randn(N, K, device="cuda", dtype=torch.float16)
        y = st.linear(x, A)
        ref = x.double() @ wd.double().T
        err = ((y.double() - ref).norm() / ref.norm()).item()
        c = dispatch.find_choice(A, N, "float16")
        ours = sorted(cold_replay(lambda: st.linear(x, A)) for _ in range(3))[1]
        dense = sorted(cold_replay(lambda: F.linear(x, wd)) for _ in range(3))[1]
        print(json.dumps(dict(tree=tree, shape=name, N=N, us=round(ours * 1e6, 2), dense_us=round(dense * 1e6, 2),
                              x_dense=round(dense / ours, 3), err=err, pick=f"{c.backend} {c.config}")), flush=True)
    del w, A, wd
    torch.cuda.empty_cache()
