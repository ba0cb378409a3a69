"""spmm_nm's A copies by loop-invariant pointers (this commit) against the previous kernel
(src/spmm_nm_prev.cu, a copy of it): the tuned picks of 2:4 and 64:2:8 decode launched directly,
timed in turns by cold replay; outputs compared with each other and the float64 reference."""
import json
import os
import statistics

import torch

from spartune.kernels import cuda
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

C = K.Config
SHAPES = {"7b-up": (11008, 4096), "7b-down": (4096, 11008), "13b-up": (13824, 5120), "70b-up": (28672, 8192)}
CASES = [
    ("64:2:8", 1, "7b-up", C(32, 8, 8, 4, stages=3, x_whole=True)), ("64:2:8", 1, "7b-down", C(16, 8, 8, 8, stages=3, x_whole=True)),
    ("64:2:8", 1, "13b-up", C(32, 8, 4, 2, stages=3, x_whole=True)), ("64:2:8", 1, "70b-up", C(32, 8, 4, 2, stages=3, x_whole=True)),
    ("64:2:8", 16, "7b-up", C(32, 16, 8, 2, stages=3)), ("64:2:8", 16, "7b-down", C(32, 8, 8, 4, stages=3)),
    ("64:2:8", 16, "13b-up", C(64, 16, 4, 2, stages=3)), ("64:2:8", 16, "70b-up", C(64, 16, 4, 1, stages=3)),
    ("2:4", 1, "7b-up", C(32, 8, 4, 2, stages=3)), ("2:4", 1, "7b-down", C(32, 8, 16, 8, stages=3)),
    ("2:4", 1, "13b-up", C(32, 8, 8, 4, stages=3)), ("2:4", 1, "70b-up", C(16, 8, 8, 8, stages=3)),
    ("2:4", 16, "7b-down", C(32, 16, 16, 8, stages=3, cluster_m=2)), ("2:4", 16, "13b-up", C(32, 16, 4, 2, stages=3, cluster_m=4)),
]
_instance = cuda.instance


def bound(A, x, out, cfg, prev):
    def inst(template, entry, defines, **kw):
        return _instance("spmm_nm_prev.cu" if prev else template, entry, defines, **kw)
    K.cuda.instance = inst
    K._kernels.clear()
    try:
        run = K.bind(A, x, out, cfg)
    finally:
        K.cuda.instance = _instance
        K._kernels.clear()
    return lambda: run(x, out, None, None)


rows = []
for pattern, n, shape, cfg in CASES:
    M, Kd = SHAPES[shape]
    A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), pattern)
    x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
    outs = {p: torch.full((n, M), float("nan"), device="cuda", dtype=torch.float16) for p in (0, 1)}
    calls = {p: bound(A, x, outs[p], cfg, p) for p in (1, 0)}
    for call in calls.values():
        call()
    ref = x.double() @ A.to_dense().double().t()
    err = (outs[0].double() - ref).abs().max().item() / ref.abs().max().item()
    same = torch.equal(outs[0], outs[1])
    times = {p: [] for p in calls}
    for _ in range(3):
        for p, call in calls.items():
            times[p].append(cold_replay(call) * 1e6)
    row = dict(pattern=pattern, n=n, shape=shape, config=str(cfg), prev_us=statistics.median(times[1]),
               new_us=statistics.median(times[0]), rel_err=err, identical=same)
    rows.append(row)
    print(f"{pattern:7} N={n:<3} {shape:8} prev {row['prev_us']:6.1f} new {row['new_us']:6.1f} "
          f"({row['new_us'] / row['prev_us'] - 1:+.1%}) err {err:.1e} identical {same}", flush=True)
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "out"), "a_issue_ab.json"), "w"), indent=1)
