"""Does a sparse model's call wait for the GPU? Host-side CUDA API calls of eager and compiled
forwards (torch.profiler), per call; and wall time per call of each."""
import copy
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

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
    for label, f in (("sparse eager", call(model)), ("sparse compile", call(torch.compile(model))),
                     ("dense compile", call(torch.compile(dense)))):
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            f()
        host = (time.perf_counter() - t) / 10
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 10
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                f()
            torch.cuda.synchronize()
        print(f"== {label}: host {host * 1e3:.3f} ms/call, wall {wall * 1e3:.3f} ms/call")
        for e in prof.key_averages():
            if e.key.startswith("cuda") or e.key.startswith("cu") or "item" in e.key or "local_scalar" in e.key \
                    or "Memcpy" in e.key or "nonzero" in e.key:
                print(f"   {e.key[:60]:<60} calls {e.count / 5:6.1f}/fwd  cpu {e.cpu_time_total / 5:9.1f} us/fwd")
