"""Probe (session 16): csr_tc (CSR decode on mma.m16n8k16, tiles expanded in shared memory) over
its space beside cuBLAS, fp16, each call replayed from a CUDA graph after an L2 flush; every output
checked against fp32."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from spartune.tune.measure import cold_replay as seconds  # noqa: E402  (graph replays: no host time)
from spartune.formats import CSR  # noqa: E402
from spartune.kernels import cuda  # noqa: E402
from spartune.kernels import spmm_csr_tc as T  # noqa: E402
from spartune.tune.problem import Problem  # noqa: E402

SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
SHAPES = {k: SHAPES[k] for k in os.environ.get("SHAPES", ",".join(SHAPES)).split(",")}
density = float(os.environ.get("DENSITY", "0.1"))
dtype = getattr(torch, os.environ.get("DTYPE", "float16"))
ns = [int(a) for a in sys.argv[1:]] or [8, 16, 32]
rows = []
for name, (M, K) in SHAPES.items():
    w = torch.randn(M, K, device="cuda", dtype=dtype)
    w = w * (torch.rand(M, K, device="cuda") < density)
    A = CSR.from_dense(w)
    for N in ns:
        x = torch.randn(N, K, device="cuda", dtype=dtype)
        out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype)
        expect = x.float() @ w.float().T
        prob = Problem("linear", "csr", M, K, N, str(dtype).split(".")[1], A.stats(), device="nvidia-h100_sm_90")
        configs = T.space(prob)
        cuda.precompile([i for c in configs for i in T.instances(prob, c)], x.device)
        dense = seconds(lambda: F.linear(x, w))
        timed = []
        for cfg in configs:
            out.fill_(float("nan"))
            T.launch(A, x, out, cfg)
            err = ((out.float() - expect).norm() / expect.norm()).item()
            assert err < 2e-2 and not out.isnan().any(), (name, N, cfg, err)
            timed.append((seconds(lambda: T.launch(A, x, out, cfg), rep_ms=20), cfg))
        timed.sort(key=lambda t: t[0])
        t, cfg = timed[0]
        rows.append(dict(shape=name, N=N, density=density, dense_us=dense * 1e6, best_us=t * 1e6, best=str(cfg),
                         timed=[(s * 1e6, str(c)) for s, c in timed[:8]]))
        print(f"{name} N={N} d={density} dense {dense * 1e6:.1f} us  csr_tc {t * 1e6:.1f} us ({dense / t:.2f}x) {cfg}",
              flush=True)
out_dir = os.environ.get("OUT", "out")
os.makedirs(out_dir, exist_ok=True)
json.dump(rows, open(os.path.join(out_dir, f"csr_tc_probe_{density}.json"), "w"), indent=1)
