"""Probe (session 20): csr_smem row blocks of 3, 6 or 7 warp rows (12, 24, 28 warps) against the
session-19 picks, cold replays, 90% fp16, beside cuBLAS. Prints one line per config; JSON in $OUT."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune.kernels import spmm_csr_smem as K
from spartune.tune import model
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem
from spartune.tune.tuner import load_or_calibrate

C = K.Config
OLD = {  # session 19's tuned picks (results/2026-11-26/session19/bench_csr_decode_90_after_review.json)
    ("qkv", 8): C(8, 4096, 32, 1, 1, 32), ("qkv", 16): C(16, 2048, 32, 1, 1, 8, 2),
    ("7b-up", 8): C(8, 4096, 32, 1, 1, 8), ("7b-up", 16): C(16, 4096, 32, 1, 1, 4),
    ("7b-down", 8): C(8, 4096, 32, 1, 1, 8, 3), ("7b-down", 16): C(16, 4096, 32, 2, 1, 8, 3),
    ("70b-up", 8): C(8, 8192, 32, 1, 1, 4), ("70b-up", 16): C(16, 4096, 32, 4, 1, 4, 2),
}
SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
TOP = int(os.environ.get("TOP", 6))


def cold(fn):
    fn()
    torch.cuda.synchronize()
    return cold_replay(fn)


def main():
    spec = load_or_calibrate(None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = sys.argv[1:] or [f"{s}:{n}" for s in SHAPES for n in (8, 16)]
    rows = []
    for case in cases:
        name, n = case.split(":")
        N = int(n)
        M, Kd = SHAPES[name]
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
        w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        expect = x.double() @ w.double().T
        prob = Problem("linear", "csr", M, Kd, N, "float16", A.stats(), device=device_name())
        space = K.space(prob)
        pred = {c: model.predict(K.features(prob, c), spec, "float16") for c in space}
        ranked = sorted(space, key=pred.get)
        new = [c for c in ranked if c.warps in (12, 24, 28)][:TOP]
        old_top = [c for c in ranked if c.warps not in (12, 24, 28)][:2]
        configs = list(dict.fromkeys([OLD[(name, N)], *old_top, *new]))
        dense = cold(lambda: F.linear(x, w))
        for cfg in configs:
            fn = lambda: K.launch(A, x, out, cfg)  # noqa: E731
            out.fill_(float("nan"))
            fn()
            err = ((out.double() - expect).norm() / expect.norm()).item()
            t = cold(fn) if err < 2e-2 else float("nan")
            r = dict(case=case, config=str(cfg), s=t, err=err, dense_s=dense, rank=ranked.index(cfg) if cfg in pred else -1,
                     pred_s=pred.get(cfg), ctas=K._ctas(prob, cfg), old=cfg == OLD[(name, N)])
            rows.append(r)
            print(f"{case:<10} {'OLD ' if r['old'] else '    '}{str(cfg):<62} {t * 1e6:7.1f} us  x{dense / t:5.2f}  "
                  f"rank {r['rank']:3d} pred {r['pred_s'] * 1e6 if r['pred_s'] else float('nan'):6.1f}  ctas {r['ctas']}  "
                  f"err {err:.1e}", flush=True)
        K.release_unused(A, [])
        torch.cuda.empty_cache()
    os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "out"), "warp_rows_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
