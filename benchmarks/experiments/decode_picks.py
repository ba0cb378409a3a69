"""Probe (session 29, lead 2 of session 28): which backend the tuner picks for 2:4 (and 64:2:8) at
decode on the Llama-7B layer's shapes, and what an eager call costs end to end (back-to-back calls,
wall time a call) beside F.linear, in turns."""
import sys
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.prune import sparsify_weight

torch.set_grad_enabled(False)


def per_call(fn, calls=50):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


NS = [int(a) for a in sys.argv[1:]] or [1, 8]  # (token counts; prefill: 2048)
for pattern in ("2:4", "64:2:8"):
    for M, K in ((4096, 4096), (11008, 4096), (4096, 11008)):
        W = torch.randn(M, K, device="cuda", dtype=torch.float16)
        A = sparsify_weight(W, pattern)
        for n in NS:
            x = torch.randn(n, K, device="cuda", dtype=torch.float16)
            st.linear(x, A)
            c = dispatch.find_choice(A, n, "float16")
            rows = []
            for _ in range(5 if n <= 64 else 2):
                rows.append((per_call(lambda: st.linear(x, A)), per_call(lambda: F.linear(x, W))))
            ours = sorted(r[0] for r in rows)[len(rows) // 2]
            dense = sorted(r[1] for r in rows)[len(rows) // 2]
            print(f"{pattern} {M}x{K} N={n}: {c.backend} {c.config} measured {c.measured * 1e6:.1f} us | "
                  f"eager wall/call ours {ours:.1f} dense {dense:.1f}", flush=True)
