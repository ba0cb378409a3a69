"""Probe (session 28): the e2e suite's eager Llama-7B layer at decode (N = 1, 8) runs 2:4 at
0.83-0.85x of dense and 64:2:8 N = 8 at 0.61x, though a tuned call alone costs ~5 us of host
more than F.linear (bench_host.py): where does the layer's host time go? Host time per layer call
(queued behind a GPU sleep), then a cProfile of 50 calls. python decode_host.py"""
import cProfile
import io
import os
import pstats
import time

import torch

import spartune as st
from spartune.bench import e2e

out_dir = os.environ.get("OUT", "out")
report = io.StringIO()


def say(s):
    print(s, flush=True)
    report.write(s + "\n")


def host_us(fn, calls=50):
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * 3000 * 2e3))
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
        torch.cuda.synchronize()
    return best * 1e6


torch.set_grad_enabled(False)
for n in (1, 8):
    for pattern in ("dense", "2:4", "64:2:8"):
        torch.manual_seed(0)
        model, call = e2e._llama(n, decode=True)(torch.float16, "cuda", False)
        if pattern != "dense":
            st.sparsify(model, pattern)
        fn = call(model)
        fn()
        torch.cuda.synchronize()
        say(f"N={n} {pattern}: host us per layer call {host_us(fn):.0f}")
        if pattern != "dense":
            prof = cProfile.Profile()
            torch.cuda._sleep(int(50 * 3000 * 2e3))
            prof.enable()
            for _ in range(50):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
            say(s.getvalue())
open(os.path.join(out_dir, "decode_host.txt"), "w").write(report.getvalue())
