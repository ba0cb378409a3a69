"""Host time of a sparse model's forward (eager and compiled): wall per call without a profiler,
then cProfile of 20 calls (GPU work is async), by cumulative time."""
import copy
import cProfile
import pstats
import sys
import time

import torch

import spartune as st
from spartune.bench import e2e

name = sys.argv[1] if len(sys.argv) > 1 else "llama7b-layer prefill 2048"
pattern = sys.argv[2] if len(sys.argv) > 2 else "block:64"
w = next(w for w in e2e.WORKLOADS if w.name == name)
torch.manual_seed(0)
dense, call = w.build(torch.float16, "cuda", False)
model = copy.deepcopy(dense)
st.sparsify(model, pattern, 0.9)
with torch.no_grad():
    for label, f in (("eager", call(model)), ("compile", call(torch.compile(model)))):
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            f()
        host = (time.perf_counter() - t) / 20
        torch.cuda.synchronize()
        print(f"== {name} {pattern} {label}: host {host * 1e3:.3f} ms/call")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            f()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("cumtime").print_stats(45)
