"""The tuner's pick at a margin, write-evicted timings alone (rotate=False) against our best and
dense re-ranked on rotating weight copies (rotate=True): per case, fresh tunings in turns (no DB),
each one's pick, tuning wall time, and the pick's call timed write-evicted and rotated, with
F.linear beside it. JSON to $OUT/rotated_margin_probe.json, a table last."""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.tune.measure import cold_replay, rotated_replay
from spartune.tune.tuner import Tuner, load_or_calibrate

CASES = [("qkv", 4096, 4096, 0.1, 32), ("70B up", 28672, 8192, 0.1, 32), ("7B up", 11008, 4096, 0.1, 32),
         ("qkv", 4096, 4096, 0.3, 16), ("70B up", 28672, 8192, 0.3, 16), ("qkv", 4096, 4096, 0.2, 16),
         ("7B up", 11008, 4096, 0.3, 16)]
TRIALS = int(os.environ.get("TRIALS", 2))
spec = load_or_calibrate(None)
rows = []
for name, M, K, density, N in CASES:
    g = torch.Generator("cuda").manual_seed(0)
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    w = w * (torch.rand(M, K, device="cuda", generator=g) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
    dense_w = cold_replay(lambda: F.linear(x, w))
    dense_r = rotated_replay(lambda w: F.linear(x, w), w, w.numel() * 2)
    for trial in range(TRIALS):
        for rotate in (False, True):
            dispatch._tuner = Tuner(None, spec, mode="fast", rotate=rotate)
            dispatch._forget()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            st.linear(x, A)
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
            choice = next(iter(dispatch._states[A].chosen.values()))
            ours_w = cold_replay(lambda: st.linear(x, A))
            ours_r = rotated_replay(lambda A: st.linear(x, A), A, A.nbytes)
            row = dict(case=f"{name} {1 - density:.0%} N={N}", trial=trial, rotate=rotate, pick=choice.backend,
                       config=str(choice.config), tune_s=tune_s, dense_write=dense_w, dense_rot=dense_r,
                       ours_write=ours_w, ours_rot=ours_r, x_write=dense_w / ours_w, x_rot=dense_r / ours_r)
            rows.append(row)
            print(json.dumps(row), flush=True)
    del w, A, x
    torch.cuda.empty_cache()
out = os.environ.get("OUT", ".")
json.dump(rows, open(f"{out}/rotated_margin_probe.json", "w"), indent=1)
print(f"\n{'case':22} {'rot':>4} {'pick':>9} {'tune s':>7} {'x write':>8} {'x rot':>6}")
for r in rows:
    print(f"{r['case']:22} {str(r['rotate']):>5} {r['pick']:>9} {r['tune_s']:7.2f} {r['x_write']:8.2f} {r['x_rot']:6.2f}")
