"""Sanity check of measure.cold_replay on the GPU: repeatability, and a tiny kernel stays positive."""
import torch, torch.nn.functional as F, time
from spartune.tune.measure import time_callable, cold_replay
w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for n in (16, 2048):
    x = torch.randn(n, 4096, device="cuda", dtype=torch.float16)
    t0 = time.time()
    ts = [cold_replay(lambda: F.linear(x, w), 2) * 1e6 for _ in range(5)]
    print(n, "cold_replay us", [round(v, 2) for v in ts], "time_callable", round(time_callable(lambda: F.linear(x, w), rep_ms=2) * 1e6, 2), f"{time.time() - t0:.2f}s")
e = torch.empty(1, device="cuda")
print("tiny", [round(cold_replay(lambda: e.add_(1), 2) * 1e6, 2) for _ in range(3)])
