"""Probe (session 24): csr_bitmap (CSR on mma.m16n8k16, A's fragments decoded in registers from
bitmap tiles) over its whole space beside cuBLAS and csr_smem's best of its model-ranked top few;
every call replayed from a CUDA graph after an L2 flush (cold_replay); every output checked in
float64 (NaN-filled first, so an unwritten element fails).

    SHAPES=qkv,7b-up N=8,16,32 DENSITY=0.1,0.2 TOP=8 python benchmarks/experiments/csr_bitmap_probe.py
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
from spartune.kernels import spmm_csr_bitmap as B  # noqa: E402
from spartune.tune.device import device_name  # noqa: E402
from spartune.tune.tuner import load_or_calibrate  # noqa: E402
from spartune.tune.problem import Problem  # noqa: E402

SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
SHAPES = {k: SHAPES[k] for k in os.environ.get("SHAPES", ",".join(SHAPES)).split(",")}
NS = [int(n) for n in os.environ.get("N", "8,16,32").split(",")]
DENSITIES = [float(d) for d in os.environ.get("DENSITY", "0.1,0.2").split(",")]
top = int(os.environ.get("TOP", "8"))
dtype = getattr(torch, os.environ.get("DTYPE", "float16"))
gen = torch.Generator(device="cuda").manual_seed(0)
spec = load_or_calibrate(None)
rows = []
for M, K, N, density in ((37, 1000, 7, 0.5), (100, 3000, 17, 0.3), (16, 64, 1, 1.0), (300, 520, 32, 0.05)):
    w = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < density)
    w[M // 2] = torch.randn(K, device="cuda", dtype=dtype, generator=gen)  # a row with every column
    A = st.CSR.from_dense(w)
    x = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen)
    expect = x.double() @ w.double().T
    prob = Problem("linear", "csr", M, K, N, str(dtype).split(".")[1], A.stats(), device=device_name())
    for cfg in B.space(prob):
        out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype)
        B.launch(A, x, out, cfg)
        err = ((out.double() - expect).norm() / expect.norm()).item()
        assert err < 2e-2 and not out.isnan().any(), (M, K, N, density, cfg, err)
print("odd shapes ok", flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
for density in DENSITIES:
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
            configs = B.space(prob)
            cuda.precompile([i for c in configs for i in B.instances(prob, c)], x.device)
            smem_s, smem_cfg, _ = best_of(spmm_csr_smem, A, x, out, prob, expect, top, spec)
            timed = []
            for cfg in configs:
                out.fill_(float("nan"))
                B.launch(A, x, out, cfg)
                err = ((out.double() - expect).norm() / expect.norm()).item()
                assert err < 2e-2 and not out.isnan().any(), (name, N, cfg, err)
                timed.append((cold(lambda: B.launch(A, x, out, cfg)), cfg))
            timed.sort(key=lambda t: t[0])
            t, cfg = timed[0]
            rows.append(dict(shape=name, N=N, density=density, dense_us=dense * 1e6, smem_us=smem_s * 1e6,
                             smem=smem_cfg, bitmap_us=t * 1e6, bitmap=str(cfg),
                             timed=[(s * 1e6, str(c)) for s, c in timed]))
            print(f"{name} N={N} d={density} dense {dense * 1e6:.1f}  smem {smem_s * 1e6:.1f} ({dense / smem_s:.2f}x)  "
                  f"bitmap {t * 1e6:.1f} ({dense / t:.2f}x) {cfg}", flush=True)
            json.dump(rows, open(os.path.join(out_dir, "csr_bitmap_probe.json"), "w"), indent=1)
        del A, w
