"""Probe (session 25): csr_smem with the output rows stored on chip right after the offsets' wait
(their registers free before the stream's loads: fewer spills) against v15 as benchmarked
(src/spmm_csr_smem_old.cu, commit af4c4c8),
the tuned picks of session 24's final run, timed in turns (cold replays, 5 rounds), fp16 and bf16;
outputs checked against float64.

    python benchmarks/experiments/rows_copy_probe.py
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
    ("70b-up", 28672, 8192, 8, 0.1, C(8, 8192, 28, 1, 1, 4)),
    ("qkv", 4096, 4096, 16, 0.1, C(16, 4096, 16, 1, 1, 8)),
    ("7b-up", 11008, 4096, 16, 0.1, C(16, 4096, 24, 1, 1, 4)),
    ("7b-down", 4096, 11008, 16, 0.1, C(16, 3680, 24, 1, 1, 4)),
    ("70b-up", 28672, 8192, 16, 0.1, C(16, 4096, 28, 2, 1, 4, 2, 16)),
    ("7b-down", 4096, 11008, 8, 0.2, C(8, 5504, 32, 1, 1, 16, 2)),
    ("7b-up", 11008, 4096, 8, 0.2, C(8, 4096, 24, 1, 1, 8)),
    ("7b-up", 11008, 4096, 16, 0.2, C(16, 4096, 24, 1, 1, 8, 1, 16)),
]
plain = K._instance
mode = {"old": False}
K._instance = lambda *a: cuda.instance(
    "spmm_csr_smem_old.cu" if mode["old"] else plain(*a).template, plain(*a).kernel, dict(plain(*a).defines),
    arch_specific=plain(*a).arch_specific)
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
for dtype in (torch.float16, torch.bfloat16):
    for name, M, Kd, N, density, cfg in CASES:
        if dtype == torch.bfloat16 and density != 0.1:
            continue
        w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
        w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < density)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
        ref = x.double() @ w.double().T
        out = torch.empty(N, M, device="cuda", dtype=dtype)
        times = {True: [], False: []}
        for rnd in range(5):
            for old in ((False, True) if rnd % 2 == 0 else (True, False)):
                mode["old"] = old
                K._kernels.clear()
                out.fill_(float("nan"))
                K.launch(A, x, out, cfg)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err < 1e-2 and not out.isnan().any(), (name, N, cfg, old, err)
                times[old].append(cold(lambda: K.launch(A, x, out, cfg)) * 1e6)
        a, b = sorted(times[False])[2], sorted(times[True])[2]
        rows.append(dict(shape=name, N=N, density=density, dtype=str(dtype), config=str(cfg), new_us=a, old_us=b,
                         times={"new": times[False], "old": times[True]}))
        print(f"{str(dtype)[6:]} {name} N={N} d={density}: new {a:.1f} us, old {b:.1f} us ({a / b - 1:+.1%})", flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, "rows_store_probe.json"), "w"), default=str, indent=1)
