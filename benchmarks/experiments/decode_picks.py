"""Probe (session 28): which backend the tuner picks for 2:4 at decode N = 8 on the Llama-7B
layer's shapes (the e2e eager / compiled decode rows moved by ~0.1 ms a call between runs)."""
import torch

import spartune as st
from spartune import dispatch
from spartune.prune import sparsify_weight

torch.set_grad_enabled(False)
for M, K in ((4096, 4096), (11008, 4096), (4096, 11008)):
    A = sparsify_weight(torch.randn(M, K, device="cuda", dtype=torch.float16), "2:4")
    for n in (1, 8):
        st.linear(torch.randn(n, K, device="cuda", dtype=torch.float16), A)
        c = dispatch.find_choice(A, n, "float16")
        print(f"{M}x{K} N={n}: {c.backend} {c.config} measured {c.measured * 1e6:.1f} us", flush=True)
