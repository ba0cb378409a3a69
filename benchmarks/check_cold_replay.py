"""Sanity check of measure.cold_replay on the GPU: repeatability on short and long calls, and a
tiny kernel stays positive.

    python benchmarks/check_cold_replay.py
"""
import statistics
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune.tune.measure import cold_replay, time_callable


def spread(name, fn, n=7):
    t0 = time.time()
    ts = [cold_replay(fn, 2) * 1e6 for _ in range(n)]
    med = statistics.median(ts)
    print(f"{name:34s} cold_replay us {[round(v, 2) for v in ts]}  median {med:.2f}  "
          f"spread {(max(ts) - min(ts)) / med:.1%}  ({time.time() - t0:.1f} s)")


w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for n in (1, 16, 2048):
    x = torch.randn(n, 4096, device="cuda", dtype=torch.float16)
    spread(f"cuBLAS 4096x4096 N={n}", lambda: F.linear(x, w))
    print(f"{'':34s} time_callable us {time_callable(lambda: F.linear(x, w), rep_ms=2) * 1e6:.2f}")
A = st.CSR.from_dense(w * (torch.rand_like(w, dtype=torch.float32) < 0.1))
x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
st.linear(x, A)  # tunes once
spread("spartune.linear CSR 90% N=1", lambda: st.linear(x, A))
e = torch.empty(1, device="cuda")
spread("tiny add_", lambda: e.add_(1), n=3)
