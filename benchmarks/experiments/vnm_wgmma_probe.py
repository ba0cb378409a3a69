"""Probe (issue 14, session 13): where the V:N:M wgmma gather loses to the 2:4 TMA kernel.
Times, on Llama-7B up (11008x4096) at N = 2048, fp16, L2 flushed: 2:4 through TMA, the same
math as V:N:M 128:2:4 (every column kept: the gather path over the whole of K, x^T read in place),
and 128:2:8 / 64:2:8, each on bm=128, bn=256. With --ncu-one PATTERN it launches that pattern's
kernel a few times for ncu to profile the last launch:

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --cache-control all --clock-control none -k regex:spmm_nm -c 1 -s 3 \
        python benchmarks/experiments/vnm_wgmma_probe.py --ncu-one 128:2:8
"""
import argparse

import torch
from triton.testing import do_bench

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

ap = argparse.ArgumentParser()
ap.add_argument("--ncu-one", default=None)
ap.add_argument("--stages", type=int, default=4)
args = ap.parse_args()
torch.manual_seed(0)
M, Kd, N = 11008, 4096, 2048
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
X = torch.randn(Kd, N, device="cuda", dtype=torch.float16)  # spmm's layout: x = X.T, read in place
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
patterns = [args.ncu_one] if args.ncu_one else ["2:4", "128:2:4", "128:2:8", "64:2:8", "64:2:16"]
for pattern in patterns:
    A = sparsify_weight(w, pattern)
    stages = 3 if pattern.startswith("64:") else args.stages
    cfg = K.Config(128, 256, 12, variant="wgmma", stages=stages, group_m=16)
    for x in ((X.T,) if args.ncu_one else (X.T, X.T.contiguous())):
        if args.ncu_one:
            for _ in range(4):
                K.launch(A, x, out, cfg)
            torch.cuda.synchronize()
            continue
        K.launch(A, x, out, cfg)
        ref = x.float() @ A.to_dense().float().T
        err = ((out.float() - ref).norm() / ref.norm()).item()
        t = do_bench(lambda: K.launch(A, x, out, cfg), warmup=10, rep=50, return_mode="median") * 1e3
        layout = "x^T in place" if x.stride(0) == 1 else "x (N, K)"
        print(f"{pattern:>8} {layout:>14} stages={stages}: {t:8.1f} us  rel.err {err:.1e}", flush=True)
