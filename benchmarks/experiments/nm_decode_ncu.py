"""Probe for the next session (issue 14, not run yet): why 2:4 decode at N = 16 costs 4-9 us more
than at N = 1 (LOG "Where 2:4 decode stands after v4b"). Launches one mma config on Llama-7B up
(11008x4096) at the given N, a few times, for ncu to profile the last launch:

    ncu --set full --cache-control all --clock-control none -k regex:spmm_nm -c 1 -s 3 \
        -o $OUT/nm_n1 python benchmarks/experiments/nm_decode_ncu.py --n 1
    (then --n 16; compare tensor pipe, L1 wavefronts of the ldmatrix reads, stall reasons)
"""
import argparse

import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=1)
ap.add_argument("--config", default="64,16,4,2,4,3", help="bm,bn,warps,warps_k,ksteps,stages")
args = ap.parse_args()
bm, bn, warps, warps_k, ksteps, stages = map(int, args.config.split(","))
cfg = K.Config(bm, bn, warps, warps_k, ksteps, stages=stages)
torch.manual_seed(0)
A = sparsify_weight(torch.randn(11008, 4096, device="cuda", dtype=torch.float16), "2:4")
x = torch.randn(args.n, 4096, device="cuda", dtype=torch.float16)
out = torch.empty(args.n, 11008, device="cuda", dtype=torch.float16)
for _ in range(4):
    K.launch(A, x, out, cfg)
torch.cuda.synchronize()
