"""Host time of a sparse model's eager forward: cProfile of 20 calls (GPU work is async)."""
import copy
import cProfile
import pstats
import sys
import time

import torch

import spartune as st
from spartune.bench import e2e

name = sys.argv[1] if len(sys.argv) > 1 else "bert-base 8x512"
pattern = sys.argv[2] if len(sys.argv) > 2 else "block:64"
w = next(w for w in e2e.WORKLOADS if w.name == name)
torch.manual_seed(0)
dense, call = w.build(torch.float16, "cuda", False)
model = copy.deepcopy(dense)
st.sparsify(model, pattern, 0.9)
with torch.no_grad():
    for label, f in (("dense", call(dense)), ("sparse", call(model))):
        f(); f(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            f()
        host = (time.perf_counter() - t) / 20
        torch.cuda.synchronize()
        gpu = (time.perf_counter() - t) / 20
        print(f"{name} {label}: host {host*1e3:.2f} ms/call, with sync {gpu*1e3:.2f} ms/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        f()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)
