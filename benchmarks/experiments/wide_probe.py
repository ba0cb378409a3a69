"""Probe (session 30): csr_smem's wide-N configs at N = 2048, 95-98%, against cuBLAS, cold."""
import json, os, sys, time
import torch, torch.nn.functional as F
import spartune as st
from spartune.kernels import spmm_csr_smem as fam
from spartune.tune import model
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem
from spartune.tune.tuner import load_or_calibrate

spec = load_or_calibrate(None)
top = int(os.environ.get("TOP", "24"))
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
for name, M, K, d in [("qkv", 4096, 4096, 0.02), ("7b-up", 11008, 4096, 0.02)]:
    N = 2048
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < d)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    expect = x.double() @ w.double().T
    prob = Problem("linear", "csr", M, K, N, "float16", A.stats(), device=device_name())
    F.linear(x, w); dense = cold_replay(lambda: F.linear(x, w))
    space = fam.space(prob) if not os.environ.get("EXPLICIT") else [
        fam.Config(nt, K if nt * K * 2 <= 200_000 else 2048, w, g, 1, 1, 1, tpl)
        for nt in (8, 16) for tpl in (8, 16) if tpl <= nt for w in (8, 16, 32) for g in (1, 2, 4, 8)]
    ranked = sorted(space, key=lambda c: model.predict(fam.features(prob, c), spec, prob.dtype))
    print(name, d, "space", len(space), "dense us", round(dense * 1e6, 1), flush=True)
    res = []
    for i, cfg in enumerate(ranked[:top]):
        try:
            fn = lambda: fam.launch(A, x, out, cfg)
            t0 = time.time(); fn(); torch.cuda.synchronize()
            err = ((out.double() - expect).norm() / expect.norm()).item()
            t = cold_replay(fn)
            pred = model.predict(fam.features(prob, cfg), spec, prob.dtype)
            res.append(dict(cfg=str(cfg), us=t * 1e6, pred_us=pred * 1e6, err=err, rank=i))
            print(f"  {i:2d} {t*1e6:8.1f} us pred {pred*1e6:7.1f} err {err:.1e} {cfg}", flush=True)
        except Exception as e:
            print("  fail", cfg, str(e)[:100], flush=True)
        fam.release_unused(A, [])
    rows.append(dict(shape=name, M=M, K=K, N=N, density=d, dense_us=dense * 1e6, configs=res))
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "wide_probe.json"), "w"), indent=1)
