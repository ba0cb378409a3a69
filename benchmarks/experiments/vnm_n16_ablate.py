"""64:2:8 at N = 16, GATHER 2 (x^T rows by cp.async): the tuned picks with x's copies left out
(ABLATE 1: wrong results, time only) and also the map's loads (ABLATE 2), timed in turns by cold
replay beside the full kernel: how much of N = 16's time over N = 1's is x's gather."""
import statistics

import torch

from spartune.kernels import cuda
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

CASES = {"7b-up": (11008, 4096, K.Config(bm=32, bn=16, num_warps=8, warps_k=2, ksteps=4, stages=3)),
         "7b-down": (4096, 11008, K.Config(bm=32, bn=8, num_warps=8, warps_k=4, ksteps=4, stages=3)),
         "13b-up": (13824, 5120, K.Config(bm=64, bn=16, num_warps=4, warps_k=2, ksteps=4, stages=3)),
         "70b-up": (28672, 8192, K.Config(bm=64, bn=16, num_warps=4, warps_k=1, ksteps=4, stages=3))}
_instance = cuda.instance


def bound(A, x, out, cfg, ablate):
    def inst(template, entry, defines, **kw):
        return _instance(template, entry, {**defines, **({"ABLATE": ablate} if ablate else {})}, **kw)
    K.cuda.instance = inst
    K._kernels.clear()
    try:
        run = K.bind(A, x, out, cfg)
    finally:
        K.cuda.instance = _instance
    return lambda: run(x, out, None, None)


for name, (M, Kd, cfg) in CASES.items():
    A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), "64:2:8")
    x = torch.randn(16, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(16, M, device="cuda", dtype=torch.float16)
    calls = {a: bound(A, x, out, cfg, a) for a in (0, 1, 2)}
    times = {a: [] for a in calls}
    for _ in range(3):
        for a, call in calls.items():
            times[a].append(cold_replay(call) * 1e6)
    print(name, {a: round(statistics.median(t), 1) for a, t in times.items()}, flush=True)
