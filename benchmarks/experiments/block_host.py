"""The block's host time, three ways: one call after a sync (the queue empty), 5 and 50 calls
back to back (a full launch queue would make the host wait for the GPU)."""
import copy
import statistics
import time

import torch

import spartune as st
from bench_model import LlamaMLP  # noqa: E402  (run from benchmarks/)

torch.set_grad_enabled(False)
torch.manual_seed(0)
dense = LlamaMLP().to("cuda", torch.float16).eval()
sparse = copy.deepcopy(dense)
st.sparsify(sparse, "block:64", 0.9)
for n in (2048, 8):
    x = torch.randn(n, 4096, device="cuda", dtype=torch.float16)
    for name, model in (("dense", dense), ("block:64", sparse)):
        model(x)
        torch.cuda.synchronize()
        one = []
        for _ in range(20):
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(x)
            one.append((time.perf_counter() - t) * 1e6)
        row = [f"one call {statistics.median(one):.0f}"]
        for reps in (5, 50):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps):
                model(x)
            row.append(f"{reps} back to back {(time.perf_counter() - t) / reps * 1e6:.0f}")
            torch.cuda.synchronize()
        print(f"N={n} {name}: host us per call: " + ", ".join(row), flush=True)
