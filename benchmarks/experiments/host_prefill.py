"""Probe (session 27): host time of tuned spartune.linear calls at prefill (N = 2048), where the
e2e suite found the Llama-7B layer with 2:4 at 0.74x of dense in eager (1.44 ms under graphs):
host time per call = wall time of back-to-back calls queued behind a GPU sleep, then a cProfile
of the same calls. python host_prefill.py"""
import cProfile
import io
import os
import pstats
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune.dispatch import find_choice
from spartune.prune import sparsify_weight

CALLS = 40
out_dir = os.environ.get("OUT", "out")
report = io.StringIO()
for pattern, (M, K) in (("2:4", (11008, 4096)), ("64:2:8", (11008, 4096)), ("2:4", (4096, 11008)),
                        ("csr", (11008, 4096))):
    torch.manual_seed(0)
    w = torch.randn(M, K, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, pattern, 0.9 if pattern == "csr" else None)
    x = torch.randn(2048, K, device="cuda", dtype=torch.float16)
    y = st.linear(x, A)  # tunes
    torch.cuda.synchronize()
    choice = find_choice(A, 2048, "float16")

    def host_us(fn):
        torch.cuda._sleep(int(3e9))  # ~1.5 s of GPU sleep: every call below only queues
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        t = (time.perf_counter() - t0) / CALLS
        torch.cuda.synchronize()
        return t * 1e6

    ours = [host_us(lambda: st.linear(x, A)) for _ in range(3)]
    dense = [host_us(lambda: F.linear(x, w)) for _ in range(3)]
    line = f"{pattern} {M}x{K} N=2048 choice {choice}: host us per call ours {min(ours):.1f} dense {min(dense):.1f}"
    print(line)
    report.write(line + "\n")
    torch.cuda._sleep(int(3e9))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        st.linear(x, A)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    report.write(s.getvalue())
open(os.path.join(out_dir, "host_prefill.txt"), "w").write(report.getvalue())
