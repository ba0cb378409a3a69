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


def wall_us(fns, calls=100, rounds=7):
    """Per-call wall time of each fn, rounds in turns (the layer is host-bound in eager: a GPU
    sleep ahead would fill the launch queue and block), median of the rounds."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t) / calls * 1e6)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


torch.set_grad_enabled(False)
for n in (1, 8):
    fns, models_ = {}, {}
    for pattern in ("dense", "2:4", "64:2:8"):
        torch.manual_seed(0)
        model, call = e2e._llama(n, decode=True)(torch.float16, "cuda", False)
        if pattern != "dense":
            st.sparsify(model, pattern)
        fns[pattern] = call(model)
        fns[pattern]()
        torch.cuda.synchronize()
    times = wall_us(fns)
    say(f"N={n} eager layer us per call (median of 7 rounds in turns): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    for pattern in ("2:4", "64:2:8"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fns[pattern]()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        say(f"N={n} {pattern}")
        say(s.getvalue())
open(os.path.join(out_dir, "decode_host.txt"), "w").write(report.getvalue())
