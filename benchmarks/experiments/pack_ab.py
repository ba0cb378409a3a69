"""Probe (session 29): the one packing (mma and wgmma read the same layout) against the previous
two, config by config: each case's config launched through a bound run, replayed cold (L2
evicted) in turns with cuBLAS. Run once per tree (PYTHONPATH picks the old or new package), in
alternation, by the driver in the same directory; prints one JSON line per case."""
import json
import sys

import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem

C = K.Config
W = dict(variant="wgmma", num_warps=12)
CASES = [  # (name, M, K, N, pattern, config)
    ("7b-up", 11008, 4096, 1, "2:4", C(32, 8, 4, 4, stages=2)),
    ("7b-up", 11008, 4096, 8, "2:4", C(16, 8, 8, 8, stages=3)),
    ("7b-down", 4096, 11008, 1, "2:4", C(32, 8, 16, 8, stages=3)),
    ("7b-down", 4096, 11008, 8, "2:4", C(32, 8, 16, 8, stages=3, cluster_m=2)),
    ("7b-down", 4096, 11008, 16, "2:4", C(32, 16, 16, 8, stages=3, cluster_m=2)),
    ("70b-up", 28672, 8192, 1, "2:4", C(32, 8, 4, 4, stages=2)),
    ("70b-up", 28672, 8192, 16, "2:4", C(32, 16, 4, 2, stages=3, cluster_m=2)),
    ("7b-down", 4096, 11008, 1, "64:2:8", C(32, 8, 16, 8, stages=3, x_whole=True)),
    ("7b-up", 11008, 4096, 8, "64:2:8", C(32, 8, 4, 2, stages=3)),
    ("7b-up", 11008, 4096, 2048, "2:4", C(128, 256, stages=4, **W)),
    ("7b-up", 11008, 4096, 2048, "2:4", C(256, 128, stages=4, cluster_m=2, **W)),
    ("7b-down", 4096, 11008, 2048, "2:4", C(128, 256, stages=5, **W)),
    ("7b-up", 11008, 4096, 2048, "64:2:8", C(128, 256, stages=4, as_24=True, **W)),
    ("7b-up", 11008, 4096, 2048, "64:2:8", C(128, 128, stages=4, **W)),
    ("7b-up", 11008, 4096, 2048, "128:2:8", C(128, 256, stages=4, **W)),
    ("o+res", 4096, 4096, 2048, "2:4", C(128, 256, stages=4, **W)),
    ("7b-down+res", 4096, 11008, 2048, "2:4", C(128, 256, stages=5, **W)),
    ("7b-down+res", 4096, 11008, 2048, "2:4", C(256, 128, stages=4, cluster_m=2, **W)),
    ("7b-up+res", 11008, 4096, 2048, "64:2:8", C(128, 256, stages=4, as_24=True, **W)),
    ("7b-up+res", 11008, 4096, 2048, "128:2:8", C(128, 256, stages=4, **W)),
]
which = sys.argv[1]
max_n = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 30  # (decode only: 16)
min_n = int(sys.argv[3]) if len(sys.argv) > 3 else 0
torch.manual_seed(0)
for name, M, Kd, N, pattern, cfg in (c for c in CASES if min_n <= c[3] <= max_n):
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, pattern)
    prob = Problem("linear", A.signature, M, Kd, N, "float16", A.stats(), device=device_name(0))
    if cfg not in K.space(prob):
        print(json.dumps(dict(tree=which, case=f"{name} {pattern} N={N}", config=str(cfg), error="not in the space")))
        continue
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    res = torch.randn(N, M, device="cuda", dtype=torch.float16) if name.endswith("+res") else None
    run = K.bind(A, x, out, cfg, residual=res)
    run(x, out, None, res)
    expect = F.linear(x.double(), A.to_dense().double()) + (0 if res is None else res.double())
    err = ((out.double() - expect).norm() / expect.norm()).item()
    pairs = [(cold_replay(lambda: run(x, out, None, res)), cold_replay(lambda: F.linear(x, w))) for _ in range(3)]
    ours = sorted(p[0] for p in pairs)[1] * 1e6
    dense = sorted(p[1] for p in pairs)[1] * 1e6
    print(json.dumps(dict(tree=which, case=f"{name} {pattern} N={N}", config=str(cfg), ours_us=round(ours, 2),
                          dense_us=round(dense, 2), x_dense=round(dense / ours, 3), rel_err=err)), flush=True)
