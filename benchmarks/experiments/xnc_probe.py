"""Probe (session 25): csr_smem's tuned N = 8 / 16 picks (fp16, 90% and 80%) with x's 16-byte staging
loads plain (XNC=0: nvcc makes them LDG.CONSTANT), `.nc.L1::no_allocate` (1) or that with
`.L2::256B` (2); in turns (cold replays, 5 rounds); outputs checked against float64.

    python benchmarks/experiments/xnc_probe.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import spartune as st  # noqa: E402
from bench_csr_decode import cold  # noqa: E402
from spartune.kernels import cuda, spmm_csr_smem as K  # noqa: E402

C = K.Config
CASES = [
    ("qkv", 4096, 4096, 8, 0.1, C(8, 4096, 16, 1, 1, 16)),
    ("7b-up", 11008, 4096, 8, 0.1, C(8, 4096, 24, 1, 1, 8)),
    ("7b-down", 4096, 11008, 8, 0.1, C(8, 3680, 24, 1, 1, 8)),
    ("qkv", 4096, 4096, 16, 0.1, C(16, 4096, 16, 1, 1, 8)),
    ("7b-up", 11008, 4096, 16, 0.1, C(16, 4096, 24, 1, 1, 4)),
    ("7b-down", 4096, 11008, 16, 0.1, C(16, 3680, 24, 1, 1, 4)),
    ("70b-up", 28672, 8192, 8, 0.1, C(8, 8192, 28, 1, 1, 4)),
    ("7b-down", 4096, 11008, 8, 0.2, C(8, 5504, 32, 1, 1, 16)),
    ("7b-up", 11008, 4096, 16, 0.2, C(16, 4096, 24, 1, 1, 8, 1, 16)),
]
plain = K._instance
MODES = {"plain": 0, "na": 1, "na256": 2}
mode = {"m": "plain"}
K._instance = lambda *a: cuda.instance(
    plain(*a).template, plain(*a).kernel, {**dict(plain(*a).defines), "XNC": MODES[mode["m"]]},
    arch_specific=plain(*a).arch_specific)
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
for name, M, Kd, N, density, cfg in CASES:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
    ref = x.double() @ w.double().T
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    names = list(MODES)
    times = {m: [] for m in names}
    for rnd in range(5):
        for m in names[rnd % 3:] + names[:rnd % 3]:
            mode["m"] = m
            K._kernels.clear()
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2 and not out.isnan().any(), (name, N, cfg, m, err)
            times[m].append(cold(lambda: K.launch(A, x, out, cfg)) * 1e6)
    med = {m: sorted(t)[2] for m, t in times.items()}
    rows.append(dict(shape=name, N=N, density=density, config=str(cfg), median_us=med, times=times))
    print(f"{name} N={N} d={density}: " + ", ".join(f"{m} {med[m]:.1f}" for m in names), flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, "xnc_probe.json"), "w"), default=str, indent=1)
