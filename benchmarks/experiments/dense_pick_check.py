"""Session 40: Llama-70B up, CSR 70%, N = 32, where bench_csr_decode timed the tuned call (a dense
pick) at 136.6 us against cuBLAS's 123.6 (the same pick at 80%: 124.5). The tuned call and F.linear
in turns, cold, 7 rounds, with the pick printed: noise of the board, or a slower dense path?"""
import statistics

import torch
import torch.nn.functional as F

import spartune as st
from spartune.bench.picks import choice_dict
from spartune.dispatch import find_choice
from spartune.tune.measure import cold_replay

for density in (0.3, 0.2):
    g = torch.Generator(device="cuda").manual_seed(7)
    w = torch.randn(28672, 8192, device="cuda", dtype=torch.float16, generator=g)
    w = w * (torch.rand(28672, 8192, device="cuda", generator=g) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(32, 8192, device="cuda", dtype=torch.float16, generator=g)
    y = st.linear(x, A)
    torch.cuda.synchronize()
    err = ((y.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()).item()
    t = {"cublas": [], "tuned": []}
    for _ in range(7):
        t["cublas"].append(cold_replay(lambda: F.linear(x, w)) * 1e6)
        t["tuned"].append(cold_replay(lambda: st.linear(x, A)) * 1e6)
    pick = choice_dict(find_choice(A, 32, "float16"))
    print(f"70B up {1 - density:.0%} N = 32: pick {pick['label'] if pick else None}, err {err:.1e}; "
          f"cuBLAS {statistics.median(t['cublas']):.1f} us {[round(v, 1) for v in t['cublas']]}; "
          f"tuned {statistics.median(t['tuned']):.1f} us {[round(v, 1) for v in t['tuned']]}", flush=True)
    del A, w
    torch.cuda.empty_cache()
