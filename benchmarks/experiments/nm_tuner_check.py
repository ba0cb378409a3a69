"""Probe: what the tuner picks for 2:4 prefill (first call tunes), and its time against cuBLAS."""
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.tune.measure import time_callable

for (M, Kd) in [(4096, 11008), (11008, 4096)]:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    keep = torch.rand(M, Kd // 4, 4, device="cuda").argsort(-1)[..., :2]
    mask = torch.zeros(M, Kd // 4, 4, device="cuda", dtype=torch.bool).scatter_(-1, keep, True)
    A = st.NM.from_dense((w.view(M, Kd // 4, 4) * mask).view(M, Kd), 2, 4)
    d = A.to_dense()
    x = torch.randn(2048, Kd, device="cuda", dtype=torch.float16)
    t0 = time.perf_counter()
    st.linear(x, A)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t, td = time_callable(lambda: st.linear(x, A)), time_callable(lambda: F.linear(x, d))
    print(f"tuner {M}x{Kd} N=2048: first call (tuning) {first:.1f} s, {t*1e6:.1f} us vs dense {td*1e6:.1f} us "
          f"-> {td/t:.2f}x; chosen {dispatch._states[A].chosen}", flush=True)
