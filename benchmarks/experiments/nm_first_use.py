"""Probe: the first call of a new shape through the tuner, 2:4 and 64:2:8 at N = 16 and 2048:
compile plus tune in a fresh cache, then in a second process (same cache dir: the cubin cache
warm, the DB holding the first process's shapes) a shape the DB has not seen.
  SPARTUNE_CACHE_DIR=/tmp/fresh python benchmarks/experiments/nm_first_use.py 1|2"""
import sys
import time

import torch

import spartune as st

phase = sys.argv[1]
shapes = {"1": [(11008, 4096), (4096, 11008)], "2": [(13824, 5120)]}[phase]
for M, Kd in shapes:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    for pattern in ("2:4", "64:2:8"):
        A = st.sparsify_weight(w, pattern)
        for N in (16, 2048):
            x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            st.linear(x, A)
            torch.cuda.synchronize()
            print(f"process {phase}: {M}x{Kd} {pattern} N={N}: first call {time.perf_counter() - t0:.2f} s", flush=True)
