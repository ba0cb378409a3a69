"""Probe: every csr_smem config, cold, on the issue-16 decode shapes at 90% (fp16), beside cuBLAS
and the model's rank, to see which configs win and how well the model ranks them.

    python benchmarks/experiments/csr_smem_space.py [--cases qkv:8,llama70b-up:16] [--out DIR]
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_csr_smem as K
from spartune.tune import model
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem
from spartune.tune.tuner import load_or_calibrate

SHAPES = {"qkv": (4096, 4096), "llama7b-up": (11008, 4096), "llama7b-down": (4096, 11008),
          "llama70b-up": (28672, 8192)}

ap = argparse.ArgumentParser()
ap.add_argument("--cases", default="qkv:8,qkv:16,qkv:32,llama70b-up:8,llama70b-up:32,llama7b-down:8")
ap.add_argument("--density", type=float, default=0.1)
ap.add_argument("--top", type=int, default=0, help="measure only the model's best TOP configs (0: all)")
ap.add_argument("--out", default=os.environ.get("OUT", "out"))
args = ap.parse_args()
spec = load_or_calibrate(None)
gen = torch.Generator(device="cuda").manual_seed(0)
results = []
for case in args.cases.split(","):
    name, n = case.split(":")
    (M, Kd), N = SHAPES[name], int(n)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < args.density)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    ref = x.float() @ w.float().T
    dense = cold_replay(lambda: F.linear(x, w))
    prob = Problem("linear", "csr", M, Kd, N, "float16", A.stats(), device=device_name())
    space = K.space(prob)
    pred = {c: model.predict(K.features(prob, c), spec, "float16") for c in space}
    rank = {c: i for i, c in enumerate(sorted(space, key=pred.get))}
    rows = []
    t0 = time.time()
    for cfg in sorted(space, key=pred.get)[:args.top or None]:
        try:
            K.launch(A, x, out, cfg)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            t = cold_replay(lambda: K.launch(A, x, out, cfg))
            rows.append(dict(config=str(cfg), us=t * 1e6, err=err, model_rank=rank[cfg], pred_us=pred[cfg] * 1e6))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(config=str(cfg), error=str(e)[:200]))
        K.release_unused(A, [])
    rows.sort(key=lambda r: r.get("us", 1e9))
    results.append(dict(case=case, dense_us=dense * 1e6, rows=rows))
    print(f"== {case}: cuBLAS cold {dense * 1e6:.1f} us; {len(space)} configs in {time.time() - t0:.0f} s")
    for r in rows[:6]:
        print(f"   {r.get('us', float('nan')):7.1f} us  x{dense * 1e6 / r.get('us', float('nan')):.2f}  "
              f"rank {r.get('model_rank')} pred {r.get('pred_us', float('nan')):.1f}  err {r.get('err', float('nan')):.1e}  {r['config']}")
    bad = [r for r in rows if "error" in r or r["err"] > 1e-2]
    if bad:
        print("   FAILED:", bad[:3])
    del w, A
    torch.cuda.empty_cache()
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "csr_smem_space.json"), "w") as f:
    json.dump(results, f, indent=1)
