"""Probe (session 25): csr_smem with DEPTH = 3 (main), 4, 5, 6 or 8 of the stream's 16-byte loads in flight
per lane (one CTA an SM's registers where DEPTH > 3), the tuned N = 8 / 16 picks of session 24 (fp16),
timed in turns (cold replays, 5 rounds, the order rotated); outputs checked against float64.

    python benchmarks/experiments/depth_probe.py
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
CASES = [  # name, M, K, N, density, config, depths
    ("qkv", 4096, 4096, 8, 0.1, C(8, 4096, 16, 1, 1, 16), (3, 4, 6, 8)),
    ("7b-up", 11008, 4096, 8, 0.1, C(8, 4096, 24, 1, 1, 8), (3, 4, 5, 6)),
    ("7b-down", 4096, 11008, 8, 0.1, C(8, 3680, 24, 1, 1, 8), (3, 4, 5, 6)),
    ("70b-up", 28672, 8192, 8, 0.1, C(8, 8192, 28, 1, 1, 4), (3, 4, 5)),
    ("qkv", 4096, 4096, 16, 0.1, C(16, 4096, 16, 1, 1, 8), (3, 4, 6)),
    ("7b-up", 11008, 4096, 16, 0.1, C(16, 4096, 24, 1, 1, 4), (3, 4, 5)),
    ("qkv", 4096, 4096, 8, 0.2, C(8, 4096, 16, 1, 1, 16), (3, 4, 6, 8)),
    ("7b-up", 11008, 4096, 8, 0.2, C(8, 4096, 24, 1, 1, 8), (3, 4, 5, 6)),
]
plain = K._instance
mode = {"depth": 3}
K._instance = lambda *a: cuda.instance(
    plain(*a).template, plain(*a).kernel, {**dict(plain(*a).defines), "DEPTH": mode["depth"]},
    arch_specific=plain(*a).arch_specific)
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
for name, M, Kd, N, density, cfg, depths in CASES:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
    ref = x.double() @ w.double().T
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    times = {d: [] for d in depths}
    for rnd in range(5):
        order = depths[rnd % len(depths):] + depths[:rnd % len(depths)]
        for d in order:
            mode["depth"] = d
            K._kernels.clear()
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2 and not out.isnan().any(), (name, N, cfg, d, err)
            times[d].append(cold(lambda: K.launch(A, x, out, cfg)) * 1e6)
    med = {d: sorted(t)[2] for d, t in times.items()}
    rows.append(dict(shape=name, N=N, density=density, config=str(cfg), median_us=med, times=times))
    print(f"{name} N={N} d={density}: " + ", ".join(f"D{d} {med[d]:.1f}" for d in depths)
          + f"  (best D{min(med, key=med.get)} {min(med.values()) / med[3] - 1:+.1%})", flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, "depth_probe.json"), "w"), default=str, indent=1)
