"""Probe (session 29): why an eager 2:4 11008x4096 N = 2048 call takes twice its graph time
(384 against 181 us) while the same kernel on 64:2:8's as_24 copy does not: count binds,
packings and tuner lookups over 20 calls, and profile the host."""
import cProfile
import pstats
import time

import torch

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

torch.set_grad_enabled(False)
counts = {}


def counted(mod, name):
    fn = getattr(mod, name)

    def wrapper(*a, **k):
        counts[name] = counts.get(name, 0) + 1
        return fn(*a, **k)
    setattr(mod, name, wrapper)


for name in ("bind", "packed", "_pack", "a_maps", "packed_as_24"):
    counted(K, name)
for pattern in ("2:4", "64:2:8"):
    for M, Kd in ((11008, 4096), (4096, 4096)):
        W = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = sparsify_weight(W, pattern)
        x = torch.randn(2048, Kd, device="cuda", dtype=torch.float16)
        st.linear(x, A)
        torch.cuda.synchronize()
        counts.clear()
        t = time.perf_counter()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            st.linear(x, A)
        prof.disable()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 20 * 1e6
        print(f"{pattern} {M}x{Kd}: {wall:.1f} us/call, counts {counts}", flush=True)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(12)
