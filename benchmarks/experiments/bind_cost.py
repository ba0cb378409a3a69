"""Host time of a CUDA family's bind (the checks and set-up of a launch for one operand layout):
the tuner once paid it on every timed call (LOG, session 36). Per family, 20 binds of fresh x
layouts timed, then the slowest functions of a cProfile of 20 more."""
import cProfile
import pstats
import time

import torch

from spartune.formats import CSR
from spartune.kernels import spmm_csr_smem as C
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

M, Kd = 4096, 11008
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
cases = {
    "64:2:8": (sparsify_weight(w, "64:2:8"), K, K.Config(bm=32, bn=8, num_warps=8, warps_k=4, ksteps=4, stages=3)),
    "2:4": (sparsify_weight(w, "2:4"), K, K.Config(bm=16, bn=8, num_warps=8, warps_k=8, ksteps=4, stages=3)),
}
try:
    A = CSR.from_dense(w * (torch.rand_like(w) < 0.1))
    cases["csr"] = (A, C, C.space(__import__("spartune.dispatch", fromlist=["x"]).linear_problem(A, 8, "float16"))[0])
except Exception as e:  # noqa: BLE001
    print("csr skipped:", type(e).__name__, e)
for name, (A, fam, cfg) in cases.items():
    outs = []
    def bind_n(n):
        x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
        out = torch.empty(n, M, device="cuda", dtype=torch.float16)
        return fam.bind(A, x, out, cfg)
    bind_n(8)  # compile, layouts
    torch.cuda.synchronize()
    ts = []
    for n in range(1, 21):
        t0 = time.perf_counter()
        bind_n(n)
        ts.append((time.perf_counter() - t0) * 1e6)
    print(name, "bind us: median", sorted(ts)[10], "min", round(min(ts)), "max", round(max(ts)), flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for n in range(21, 41):
        bind_n(n)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(14)
