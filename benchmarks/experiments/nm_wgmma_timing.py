"""Probe: the wgmma.sp variant of spmm_nm against cuBLAS and cuSPARSELt at prefill (H100, L2
flushed): every wgmma config per shape, correctness against float64 on the way.
  python benchmarks/experiments/nm_wgmma_timing.py [--quick] [--bf16]"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune.backends import cusparselt
from spartune.kernels import spmm_nm as K
from spartune.tune.device import device_name
from spartune.tune.measure import time_callable
from spartune.tune.problem import Problem

quick = "--quick" in sys.argv
dtype = torch.bfloat16 if "--bf16" in sys.argv else torch.float16
shapes = [(11008, 4096), (4096, 11008), (13824, 5120), (28672, 8192)]
ns = [2048, 8192]
rows = []
for (M, Kd) in shapes:
    g = torch.Generator(device="cuda").manual_seed(M + Kd)
    w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=g)
    keep = torch.rand(M, Kd // 4, 4, device="cuda", generator=g).argsort(-1)[..., :2]
    mask = torch.zeros(M, Kd // 4, 4, device="cuda", dtype=torch.bool).scatter_(-1, keep, True)
    w = (w.view(M, Kd // 4, 4) * mask).view(M, Kd)
    A = st.NM.from_dense(w, 2, 4)
    for N in ns:
        x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=g)
        out = torch.empty(N, M, device="cuda", dtype=dtype)
        t_dense = time_callable(lambda: F.linear(x, w))
        try:
            t_lt = time_callable(lambda: cusparselt.cusparselt_linear(A, x, out))
        except Exception as e:  # noqa: BLE001
            t_lt = float("nan")
            print("cusparselt:", type(e).__name__, str(e)[:100])
        ref = (x.double() @ w.double().T)
        prob = Problem("linear", A.signature, M, Kd, N, str(dtype).split(".")[-1], A.stats(), device=device_name())
        best = None
        configs = [c for c in K.space(prob) if c.variant == "wgmma"]
        if quick:
            configs = [c for c in configs if c.bn >= 128 and c.stages == 4]
        for cfg in configs:
            t0 = time.perf_counter()
            K.launch(A, x, out, cfg)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            err = ((out.double() - ref).norm() / ref.norm()).item()
            t = time_callable(lambda: K.launch(A, x, out, cfg))
            tf = 2 * M * N * Kd / t / 1e12
            print(f"{M}x{Kd} N={N} {cfg.bm}x{cfg.bn} st={cfg.stages} g={cfg.group_m}: {t*1e6:8.1f} us  {tf:6.0f} TF/s dense-eq "
                  f"x dense {t_dense/t:5.2f}  err {err:.1e}  first call {first:.2f}s", flush=True)
            rows.append(dict(M=M, K=Kd, N=N, cfg=str(cfg), us=t * 1e6, dense_us=t_dense * 1e6, lt_us=t_lt * 1e6, err=err))
            if best is None or t < best[0]:
                best = (t, cfg)
        t = best[0]
        print(f"== {M}x{Kd} N={N}: dense {t_dense*1e6:.1f} us, cuSPARSELt {t_lt*1e6:.1f} us, ours {t*1e6:.1f} us "
              f"({best[1].bm}x{best[1].bn} st={best[1].stages} g={best[1].group_m}): x dense {t_dense/t:.2f}, x cuSPARSELt {t_lt/t:.2f}, "
              f"{2*M*N*Kd/t/1e12:.0f} TF/s of 1720", flush=True)
out_dir = os.environ.get("OUT", ".")
with open(os.path.join(out_dir, f"nm_wgmma_timing_{str(dtype).split('.')[-1]}.json"), "w") as f:
    json.dump(rows, f, indent=1)
