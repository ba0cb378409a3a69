"""Probe (session 24): csr_smem with HALF_SUMS (fp16 products summed in fp16 pairs per chunk) against
the fp32 sums, the same config, timed in turns (cold replays, 5 rounds); outputs checked.

    DTYPE=bfloat16 ONLY16=1 python benchmarks/experiments/half_sums_probe.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import spartune as st  # noqa: E402
from bench_csr_decode import cold  # noqa: E402
from spartune.kernels import spmm_csr_smem as K  # noqa: E402

C = K.Config
CASES = [  # (shape, M, K, N, density, the tuned pick of session 24's first run)
    ("qkv", 4096, 4096, 8, 0.1, C(8, 4096, 16, 1, 1, 16)),
    ("7b-up", 11008, 4096, 8, 0.1, C(8, 4096, 24, 1, 1, 8)),
    ("7b-down", 4096, 11008, 8, 0.1, C(8, 3680, 24, 1, 1, 8)),
    ("70b-up", 28672, 8192, 8, 0.1, C(8, 8192, 28, 1, 1, 4)),
    ("7b-up", 11008, 4096, 16, 0.1, C(16, 4096, 24, 1, 1, 4)),
    ("7b-down", 4096, 11008, 8, 0.2, C(8, 3680, 16, 2, 1, 16, 3)),
    ("7b-up", 11008, 4096, 16, 0.2, C(16, 4096, 24, 1, 1, 8, 1, 16)),
    ("7b-down", 4096, 11008, 16, 0.2, C(16, 5504, 32, 1, 1, 8, 2)),
    ("qkv", 4096, 4096, 16, 0.2, C(16, 4096, 32, 1, 1, 16)),
    ("qkv", 4096, 4096, 16, 0.1, C(16, 4096, 16, 1, 1, 8)),
    ("70b-up", 28672, 8192, 16, 0.1, C(16, 4096, 28, 2, 1, 4, 2, 16)),
]
dtype = getattr(torch, os.environ.get("DTYPE", "float16"))
flag = "allow_fp16_reduced_precision_reduction" if dtype == torch.float16 else "allow_bf16_reduced_precision_reduction"
if os.environ.get("ONLY16"):
    CASES = [c for c in CASES if c[3] >= 9]
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
for name, M, Kd, N, density, cfg in CASES:
    w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
    ref = x.double() @ w.double().T
    out = torch.empty(N, M, device="cuda", dtype=dtype)
    times = {True: [], False: []}
    errs = {}
    for rnd in range(5):
        for half in ((True, False) if rnd % 2 == 0 else (False, True)):
            setattr(torch.backends.cuda.matmul, flag, half)
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            errs[half] = ((out.double() - ref).norm() / ref.norm()).item()
            times[half].append(cold(lambda: K.launch(A, x, out, cfg)) * 1e6)
    h, f = sorted(times[True])[2], sorted(times[False])[2]
    rows.append(dict(shape=name, N=N, density=density, config=str(cfg), half_us=h, fp32_us=f, err_half=errs[True],
                     err_fp32=errs[False], times=times))
    print(f"{name} N={N} d={density}: half {h:.1f} us, fp32 {f:.1f} us ({h / f - 1:+.1%}); err {errs[True]:.1e} / "
          f"{errs[False]:.1e}", flush=True)
setattr(torch.backends.cuda.matmul, flag, True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, f"half_sums_probe_{str(dtype)[6:]}.json"), "w"), default=str, indent=1)
