"""csr_mma v1's stream alone: ABLATE bit sets on 7B up N = 16 and qkv N = 16 (90%, fp16, cold)."""
import json, os
import torch
import spartune as st
from spartune.kernels import cuda, spmm_csr_mma as K
from spartune.tune.measure import cold_replay
OUT = os.environ.get("OUT", "out")
gen = torch.Generator(device="cuda").manual_seed(0)
res = {}
for name, M, Kd in [("qkv", 4096, 4096), ("7b-up", 11008, 4096)]:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    x = torch.randn(16, Kd, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(16, M, device="cuda", dtype=torch.float16)
    for occ in (1, 2):
        cfg = K.Config(128, 16, 8, 1, 6, occ)
        for a in (0, 3, 3 | 16, 3 | 4, 3 | 8, 3 | 4 | 8, 3 | 4 | 8 | 16):
            K._kernel = lambda config, dtype, index, act, a=a: cuda.load(K._instance(config, dtype, act, ABLATE=a), torch.device("cuda", index))
            fn = lambda: K.launch(A, x, out, cfg)
            fn(); torch.cuda.synchronize()
            res[f"{name} occ{occ} ablate{a}"] = t = cold_replay(fn) * 1e6
            print(f"{name} occ {occ} ablate {a:2d}: {t:6.1f} us", flush=True)
json.dump(res, open(os.path.join(OUT, "csr_mma_ablate.json"), "w"), indent=1)
