"""Probe (session 17): csr_tc (CSR decode on mma.m16n8k16, tiles expanded in shared memory) over
its whole space beside cuBLAS and csr_smem's best of its model-ranked top few, fp16, every call
replayed from a CUDA graph after an L2 flush (cold_replay); every output checked in float64.

    SHAPES=70b-up,7b-up N=8,16,32 DENSITY=0.1 TOP=6 python benchmarks/experiments/csr_tc_probe.py
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import spartune as st  # noqa: E402
from bench_csr_decode import best_of, cold  # noqa: E402
from spartune.kernels import cuda, spmm_csr_smem  # noqa: E402
from spartune.kernels import spmm_csr_tc as T  # noqa: E402
from spartune.tune.device import device_name  # noqa: E402
from spartune.tune.tuner import load_or_calibrate  # noqa: E402
from spartune.tune.problem import Problem  # noqa: E402

SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
SHAPES = {k: SHAPES[k] for k in os.environ.get("SHAPES", ",".join(SHAPES)).split(",")}
NS = [int(n) for n in os.environ.get("N", "8,16,32").split(",")]
density = float(os.environ.get("DENSITY", "0.1"))
top = int(os.environ.get("TOP", "6"))
dtype = getattr(torch, os.environ.get("DTYPE", "float16"))
gen = torch.Generator(device="cuda").manual_seed(0)
spec = load_or_calibrate(None)
rows = []
for name, (M, K) in SHAPES.items():
    w = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < density)
    A = st.CSR.from_dense(w)
    for N in NS:
        x = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen)
        out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype)
        expect = x.double() @ w.double().T
        prob = Problem("linear", "csr", M, K, N, str(dtype).split(".")[1], A.stats(), device=device_name())
        dense = cold(lambda: F.linear(x, w))
        from spartune.tune import model
        ranked = sorted(spmm_csr_smem.space(prob), key=lambda c: model.predict(spmm_csr_smem.features(prob, c), spec,
                                                                               prob.dtype))[:top]
        configs = T.space(prob)
        cuda.precompile([i for c in ranked for i in spmm_csr_smem.instances(prob, c)]
                        + [i for c in configs for i in T.instances(prob, c)], x.device)
        smem_s, smem_cfg, _ = best_of(spmm_csr_smem, A, x, out, prob, expect, top, spec)
        timed = []
        for cfg in configs:
            out.fill_(float("nan"))
            try:
                T.launch(A, x, out, cfg)
            except ValueError as e:  # a warp's words past shared memory
                print("skip", cfg, str(e)[:80])
                continue
            err = ((out.double() - expect).norm() / expect.norm()).item()
            assert err < 2e-2 and not out.isnan().any(), (name, N, cfg, err)
            timed.append((cold(lambda: T.launch(A, x, out, cfg)), cfg))
        timed.sort(key=lambda t: t[0])
        t, cfg = timed[0]
        rows.append(dict(shape=name, N=N, density=density, dense_us=dense * 1e6, smem_us=smem_s * 1e6,
                         smem=smem_cfg, tc_us=t * 1e6, tc=str(cfg), timed=[(s * 1e6, str(c)) for s, c in timed[:8]]))
        print(f"{name} N={N} d={density} dense {dense * 1e6:.1f}  smem {smem_s * 1e6:.1f} ({dense / smem_s:.2f}x)  "
              f"csr_tc {t * 1e6:.1f} ({dense / t:.2f}x) {cfg}", flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, f"csr_tc_probe_{density}.json"), "w"), indent=1)
