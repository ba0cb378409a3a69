"""csr_mma v1: where a unit's time goes. Stages and occupancy swept, then the best config with its
scatter and zeroing (ABLATE 1), its multiply (2) or both (3) left out (wrong results, timing only),
fp16 90%, cold. JSON in $OUT/csr_mma_sweep.json."""
import json, os, sys
import torch
import torch.nn.functional as F
import spartune as st
from spartune.kernels import cuda, spmm_csr_mma as K
from spartune.tune.measure import cold_replay

OUT = os.environ.get("OUT", "out"); os.makedirs(OUT, exist_ok=True)
gen = torch.Generator(device="cuda").manual_seed(0)
plain = K._kernel
def ablated(a):
    return lambda config, dtype, index, act: cuda.load(K._instance(config, dtype, act, ABLATE=a), torch.device("cuda", index))
res = []
for name, M, Kd, N in [("qkv", 4096, 4096, 16), ("7b-up", 11008, 4096, 16), ("7b-up", 11008, 4096, 32), ("70b-up", 28672, 8192, 16)]:
    dt = torch.float16
    w = torch.randn(M, Kd, device="cuda", dtype=dt, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=dt, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=dt)
    ref = x.double() @ w.double().T
    dense = cold_replay(lambda: F.linear(x, w))
    rows = []
    for stg in (4, 6, 8):
        for occ in (1, 2):
            for wn in (1, 2):
                cfg = K.Config(128, N, 8, wn, stg, occ)
                fn = lambda: K.launch(A, x, out, cfg)
                try:
                    fn(); torch.cuda.synchronize()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    rows.append(dict(cfg=str(cfg), us=cold_replay(fn) * 1e6, err=err))
                except Exception as e:
                    rows.append(dict(cfg=str(cfg), us=1e9, err=str(e)[:100]))
    best = min(rows, key=lambda r: r["us"])
    cfg = eval("K." + best["cfg"])
    abl = {}
    for a in (1, 2, 3):
        K._kernel = ablated(a)
        fn = lambda: K.launch(A, x, out, cfg)
        fn(); torch.cuda.synchronize()
        abl[a] = cold_replay(fn) * 1e6
    K._kernel = plain
    r = dict(shape=name, N=N, dense_us=dense * 1e6, best=best, ablate=abl, all=rows)
    res.append(r)
    print(json.dumps({k: v for k, v in r.items() if k != "all"}), flush=True)
    for row in rows:
        print("   ", row, flush=True)
json.dump(res, open(os.path.join(OUT, "csr_mma_sweep.json"), "w"), indent=1)
