"""Probe (session 30, lead 2 of session 29): why an eager 64:2:8 call at N = 8 with a 16-warp
GATHER 2 pick costs ~65 us a call for ~12-20 us of graph time. Kernel timeline under torch.profiler."""
import os
import time
import torch
import torch.nn.functional as F
import spartune as st
from spartune import dispatch
from spartune.prune import sparsify_weight

torch.set_grad_enabled(False)


def per_call(fn, calls=200):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


for M, K in ((4096, 4096), (4096, 11008), (11008, 4096)):
    W = torch.randn(M, K, device="cuda", dtype=torch.float16)
    A = sparsify_weight(W, "64:2:8")
    x = torch.randn(8, K, device="cuda", dtype=torch.float16)
    st.linear(x, A)
    c = dispatch.find_choice(A, 8, "float16")
    ours = [per_call(lambda: st.linear(x, A)) for _ in range(3)]
    dense = [per_call(lambda: F.linear(x, W)) for _ in range(3)]
    print(f"{M}x{K}: {c.backend} {c.config} measured {c.measured*1e6:.1f} us; eager/call ours {sorted(ours)[1]:.1f} "
          f"dense {sorted(dense)[1]:.1f}", flush=True)
    if os.environ.get('PROFILE', '1') == '0':
        continue
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(30):
            st.linear(x, A)
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    last = evs[-8:]
    t0 = last[0].time_range.start
    for e in last:
        print(f"   {e.time_range.start - t0:9.1f} +{e.time_range.elapsed_us():7.1f}  {e.name[:90]}")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=6), flush=True)
