"""Probe (session 21, csr_smem v12): 16 tokens a lane against 8, side by side, cold (90%): for each
shape and N the model's top TOP configs of each tokens-per-lane, every output checked.
python tpl_probe.py [--dtype float16] [--n 16 32] [--top 12]"""
import argparse
import json
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_csr_smem as K
from spartune.tune import model
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem
from spartune.tune.tuner import load_or_calibrate

SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--n", type=int, nargs="+", default=[16])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    spec = load_or_calibrate(None)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name in args.shapes.split(","):
        M, Kd = SHAPES[name]
        w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
        w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
        A = st.CSR.from_dense(w)
        for N in args.n:
            x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, M, device="cuda", dtype=dtype)
            expect = x.double() @ w.double().T
            prob = Problem("linear", "csr", M, Kd, N, args.dtype, A.stats(), device=device_name())
            dense = cold_replay(lambda: F.linear(x, w))
            space = K.space(prob)
            best = {}
            for tpl in (8, 16):
                mine = sorted((c for c in space if c.tpl == tpl),
                              key=lambda c: model.predict(K.features(prob, c), spec, prob.dtype))[:args.top]
                for rank, cfg in enumerate(mine):
                    fn = lambda: K.launch(A, x, out, cfg)  # noqa: E731
                    out.fill_(float("nan"))
                    fn()
                    err = ((out.double() - expect).norm() / expect.norm()).item()
                    assert err < 1e-2, (name, N, cfg, err)
                    t = cold_replay(fn)
                    rows.append(dict(shape=name, N=N, tpl=tpl, rank=rank, config=str(cfg), s=t, dense_s=dense))
                    if tpl not in best or t < best[tpl][0]:
                        best[tpl] = (t, cfg)
                K.release_unused(A, [])
            print(f"{name:<8} N={N:<3} cuBLAS {dense*1e6:6.1f}  tpl 8 {best[8][0]*1e6:6.1f} ({dense/best[8][0]:.2f}x)"
                  f"  tpl 16 {best[16][0]*1e6:6.1f} ({dense/best[16][0]:.2f}x)  {best[16][1]}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "out"), f"tpl_probe_{args.dtype}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
