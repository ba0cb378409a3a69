"""Probe (issue 16, session 19): csr_smem with a row block's K slices as one cluster (CK) against
the unclustered configs, cold beside cuBLAS; the model's best `--top` of each kind, every output
checked against the float64 reference.

    python benchmarks/experiments/csr_cluster.py [--top 8] [--n 8 16 32] [--shapes qkv ...]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import cuda, spmm_csr_smem as K
from spartune.tune import model
from spartune.tune.device import device_name
from spartune.tune.tuner import load_or_calibrate
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem

SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}


def cold(fn):
    fn()
    torch.cuda.synchronize()
    return cold_replay(fn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--n", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--all-clusters", action="store_true", help="every clustered config, not the top")
    ap.add_argument("--all-walked", action="store_true", help="every config walking the slices, not the top")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    spec = load_or_calibrate(None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name in args.shapes:
        M, Kd = SHAPES[name]
        w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
        w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < args.density)
        A = st.CSR.from_dense(w)
        for N in args.n:
            x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, M, device="cuda", dtype=dtype)
            expect = x.double() @ w.double().T
            prob = Problem("linear", "csr", M, Kd, N, args.dtype, A.stats(), device=device_name())
            ranked = sorted(K.space(prob), key=lambda c: model.predict(K.features(prob, c), spec, args.dtype))
            picks = [c for c in ranked if c.ck == 1 and not c.stream_x][:args.top]
            picks += [c for c in ranked if c.ck > 1][:None if args.all_clusters else args.top]
            picks += [c for c in ranked if c.stream_x][:None if args.all_walked else args.top]
            cuda.precompile([i for c in picks for i in K.instances(prob, c)])
            dense = cold(lambda: F.linear(x, w))
            res = []
            for c in picks:
                out.fill_(float("nan"))
                K.launch(A, x, out, c)
                err = ((out.double() - expect).norm() / expect.norm()).item()
                t = cold(lambda: K.launch(A, x, out, c)) if err < 2e-2 else None
                pred = model.predict(K.features(prob, c), spec, args.dtype)
                res.append(dict(config=str(c), ck=c.ck, walked=c.stream_x, s=t, err=err, pred=pred))
                K.release_unused(A, [])
            for kind, sel in (("plain", [r for r in res if r["ck"] == 1 and not r["walked"]]),
                              ("cluster", [r for r in res if r["ck"] > 1]), ("walked", [r for r in res if r["walked"]])):
                ok = [r for r in sel if r["s"]]
                bad = [r for r in sel if not r["s"]]
                best = min(ok, key=lambda r: r["s"]) if ok else None
                line = dict(shape=name, N=N, kind=kind, dense_us=dense * 1e6,
                            best_us=best["s"] * 1e6 if best else None, best=best["config"] if best else None,
                            wrong=len(bad))
                rows.append(line)
                print(f"{name:8s} N={N:3d} {kind:8s} dense {dense*1e6:6.1f} best "
                      f"{(best['s']*1e6 if best else float('nan')):6.1f} x{(dense/best['s'] if best else 0):.2f} "
                      f"wrong {len(bad)}  {best['config'] if best else ''}", flush=True)
            rows.append(dict(shape=name, N=N, all=res))
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "csr_cluster.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
