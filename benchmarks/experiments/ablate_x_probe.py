"""Probe (session 25): csr_smem's tuned N = 8 / 16 picks with x staged whole (ABLATE_X=0), half of
its units (1) or none (2; wrong results, timing only), in turns (cold replays, 5 rounds), fp16: what
the staging still costs after v15.

    python benchmarks/experiments/ablate_x_probe.py
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
]
plain = K._instance
mode = {"ablate": 0}
K._instance = lambda *a: cuda.instance(
    plain(*a).template, plain(*a).kernel, {**dict(plain(*a).defines), "ABLATE_X": mode["ablate"]},
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
    times = {0: [], 1: [], 2: []}
    for rnd in range(5):
        for ab in (0, 1, 2)[rnd % 3:] + (0, 1, 2)[:rnd % 3]:
            mode["ablate"] = ab
            K._kernels.clear()
            K.launch(A, x, out, cfg)
            if ab == 0:
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (name, N, cfg, err)
            times[ab].append(cold(lambda: K.launch(A, x, out, cfg)) * 1e6)
    med = {ab: sorted(t)[2] for ab, t in times.items()}
    rows.append(dict(shape=name, N=N, config=str(cfg), median_us=med, times=times))
    print(f"{name} N={N}: whole {med[0]:.1f}, half {med[1]:.1f}, none {med[2]:.1f} us", flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, "ablate_x_probe.json"), "w"), default=str, indent=1)
