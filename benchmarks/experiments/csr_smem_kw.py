"""Probe (issue 16, csr_smem v5/v6): cold times of the kw > 1 configs (warps sharing a group's
chunks; the weight in registers or through the cp.async ring) at the widest slices that fit,
against the model's top few and cuBLAS.
    python benchmarks/experiments/csr_smem_kw.py [--dtype float16] [--budget-s 300]"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_csr_smem as K
from spartune.tune import model
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem
from spartune.tune.tuner import load_or_calibrate

CASES = [("qkv", 4096, 4096, 8), ("qkv", 4096, 4096, 16), ("7b-up", 11008, 4096, 8), ("7b-down", 4096, 11008, 8),
         ("qkv", 4096, 4096, 32), ("7b-up", 11008, 4096, 16), ("70b-up", 28672, 8192, 8)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--density", type=float, default=0.1)
    args = ap.parse_args()
    t0 = time.time()
    spec = load_or_calibrate(None)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for name, M, Kd, N in CASES:
        if time.time() - t0 > args.budget_s:
            print("budget reached before", name, N)
            break
        w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
        w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < args.density)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=dtype)
        expect = x.double() @ w.double().T
        prob = Problem("linear", "csr", M, Kd, N, args.dtype, A.stats(), device=device_name())
        space = K.space(prob)
        ranked = sorted(space, key=lambda c: model.predict(K.features(prob, c), spec, args.dtype))
        widest = max(c.ks for c in space if c.kw > 1)
        todo = list(dict.fromkeys(ranked[:4] + [c for c in space if c.kw > 1 and c.ks == widest and c.gpw == 1
                                                 and c.ws in (0, 8)]))
        f = lambda: F.linear(x, w)  # noqa: E731
        f()
        dense = cold_replay(f)
        rows = []
        for cfg in todo:
            try:
                fn = lambda: K.launch(A, x, out, cfg)  # noqa: E731
                fn()
                err = ((out.double() - expect).norm() / expect.norm()).item()
                rows.append(dict(config=str(cfg), rank=ranked.index(cfg), err=err,
                                 s=cold_replay(fn) if err < 2e-2 else None))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(config=str(cfg), rank=ranked.index(cfg), error=str(e)[:200]))
            K.release_unused(A, [])
        ok = sorted((r for r in rows if r.get("s")), key=lambda r: r["s"])
        bad = [r for r in rows if not r.get("s")]
        print(f"{name} N={N}: cuBLAS {dense * 1e6:.1f} us; {len(rows)} configs, {len(bad)} failed", flush=True)
        for r in ok[:5]:
            print(f"   {r['s'] * 1e6:7.1f} us  x{dense / r['s']:.2f}  rank {r['rank']:3d}  {r['config']}")
        for r in bad[:3]:
            print("   FAILED", r)
        results.append(dict(case=name, M=M, K=Kd, N=N, dense_s=dense, rows=rows))
        del A, w
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "out"), f"csr_smem_kw_{args.dtype}.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
