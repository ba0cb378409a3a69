"""Why a GATHER 2 config (64:2:8, 7B down, N = 16) sometimes times ~200 us instead of ~25 in the
tuner: per fresh weight, the bound launch timed by do_bench (eager), by cold replay, and the host
time of one eager call."""
import time

import torch
from triton.testing import do_bench

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

M, Kd, N = 4096, 11008, 16
cfg = K.Config(bm=16, bn=16, num_warps=8, warps_k=4, ksteps=4, stages=3)
for trial in range(8):
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "64:2:8")
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    run = K.bind(A, x, out, cfg)
    call = lambda: run(x, out, None, None)  # noqa: E731
    call(); torch.cuda.synchronize()
    ref = (x.double() @ A.to_dense().double().t())
    err = (out.double() - ref).abs().max().item()
    t0 = time.perf_counter()
    for _ in range(20):
        call()
    host = (time.perf_counter() - t0) / 20
    torch.cuda.synchronize()
    eager = do_bench(call, warmup=5, rep=20, return_mode="median") * 1e-3
    graph = cold_replay(call)
    # the kernel alone, x^T made once outside
    print(f"trial {trial}: eager {eager*1e6:.1f} us, replay {graph*1e6:.1f} us, host {host*1e6:.1f} us, err {err:.2e}",
          flush=True)
