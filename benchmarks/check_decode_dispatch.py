"""The user path for CSR decode: what spartune.linear (fast mode) picks for qkv 4096x4096 at
90%, and its time hot (graph replay) and cold (L2 evicted before each call) beside cuBLAS.

    python benchmarks/check_decode_dispatch.py
"""
import torch
import torch.nn.functional as F

import spartune as st
from spartune.bench.picks import choice_dict
from spartune.dispatch import find_choice
from spartune.tune.measure import cold_replay, time_callable

g = torch.Generator(device="cuda").manual_seed(0)
M = K = 4096
w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
w = w * (torch.rand(M, K, device="cuda", generator=g) < 0.1)
A = st.CSR.from_dense(w)
for N in (1, 16, 32):
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
    y = st.linear(x, A)  # tunes on the first call
    ref = F.linear(x.float(), w.float())
    err = ((y.float() - ref).norm() / ref.norm()).item()
    ours, dense = (lambda: st.linear(x, A)), (lambda: F.linear(x, w))
    h, dh = (time_callable(f, graph=True, cold=False, rep_ms=30) * 1e6 for f in (ours, dense))
    c, dc = (cold_replay(f) * 1e6 for f in (ours, dense))
    print(f"N={N}: spartune.linear hot {h:.1f} cold {c:.1f} | cuBLAS hot {dh:.1f} cold {dc:.1f} | "
          f"x cold {dc / c:.2f} | err {err:.1e}")
    picked = choice_dict(find_choice(A, N, "float16"))
    print("   picked:", picked["label"] if picked else "?")
