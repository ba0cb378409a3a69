"""64:2:8 at N = 16 under ncu: the tuned GATHER 2 picks launched directly (argv: shape name), for
`ncu -k regex:spmm_nm --launch-skip 3 --launch-count 1 --set full`."""
import sys

import torch

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight

SHAPES = {"7b-up": (11008, 4096, K.Config(bm=32, bn=16, num_warps=8, warps_k=2, ksteps=4, stages=3)),
          "13b-up": (13824, 5120, K.Config(bm=64, bn=16, num_warps=4, warps_k=2, ksteps=4, stages=3)),
          "7b-down": (4096, 11008, K.Config(bm=32, bn=8, num_warps=8, warps_k=4, ksteps=4, stages=3))}
M, Kd, cfg = SHAPES[sys.argv[1]]
N = 16
A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16), "64:2:8")
x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
run = K.bind(A, x, out, cfg)
for _ in range(6):
    run(x, out, None, None)
torch.cuda.synchronize()
print("gather", K.mma_gather(cfg, N), "ok")
