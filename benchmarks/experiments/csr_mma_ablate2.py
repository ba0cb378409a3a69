"""csr_mma v2: what the split's reduction costs at each shape (ABLATE 16: no flush; 19: the stream
alone), 90%, fp16, cold, beside cuBLAS."""
import json, os
import torch
import torch.nn.functional as F
import spartune as st
from spartune.kernels import cuda, spmm_csr_mma as K
from spartune.tune.measure import cold_replay
OUT = os.environ.get("OUT", "out")
gen = torch.Generator(device="cuda").manual_seed(0)
res = []
for name, M, Kd in [("qkv", 4096, 4096), ("7b-up", 11008, 4096), ("70b-up", 28672, 8192)]:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    for N in (16, 32):
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        dense = cold_replay(lambda: F.linear(x, w)) * 1e6
        for cfg in [K.Config(128, N, 8, 1, 6, 2)]:
            row = dict(shape=name, N=N, cfg=str(cfg), dense=dense)
            for a in (0, 16, 32, 2 | 32, 1 | 32):
                K._kernel = lambda config, dtype, index, act, a=a: cuda.load(K._instance(config, dtype, act, ABLATE=a), torch.device("cuda", index))
                fn = lambda: K.launch(A, x, out, cfg)
                fn(); torch.cuda.synchronize()
                row[a] = cold_replay(fn) * 1e6
            res.append(row)
            print(f"{name:8} N {N:2} dense {dense:6.1f}  full {row[0]:6.1f}  no flush {row[16]:6.1f} alive {row[32]:6.1f} (no mma {row[34]:6.1f}, no scatter {row[33]:6.1f})  {cfg}", flush=True)
json.dump(res, open(os.path.join(OUT, "csr_mma_ablate2.json"), "w"), indent=1)
