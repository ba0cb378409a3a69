"""2:4 and V:N:M at prefill on the sparse tensor cores, side by side in one run with cuBLAS dense
and cuSPARSELt at its best (2:4 only): issue 14's prefill table. Per problem, the wgmma configs
of spmm_nm's space ranked by the cost model, the best `--top` of them timed (the best one is
checked against an fp32 reference), then the tuned `spartune.linear`. Every call is timed with
the L2 flushed (triton's do_bench); then cuBLAS, cuSPARSELt, the best config and the tuned call
are timed again in turns (measure.interleaved: the board sits at its power cap, where the clock
follows recent load, so separate timings move a ratio by up to ~15%), once back to back (hot)
and once with the GPU idle ~2-3 ms before each call (every call from the same cool state); the
table's ratios are those two.

    python benchmarks/bench_nm_prefill.py [--dtype bfloat16] [--n 2048 8192]
        [--shapes llama7b-up ...] [--patterns 2:4 64:2:8 ...] [--top 6] [--no-tuned] [--first-use]
        [--out DIR]

--first-use tunes first (`spartune.linear`'s first call timed: compiles and measurements, the
cubin cache as earlier problems left it; run with a fresh SPARTUNE_CACHE_DIR) and scores the
tuner's fast mode against the best of all timed (--top 0 times the whole wgmma space) two ways:
"tuned/best", the tuned call's pick against that best, both timed in turns (the score of the
tuner as it runs: its calibrated model, every candidate it has, the libraries); and "model",
the best of what tuner.fast_selection would measure among the timed configs with the uncalibrated
H100 spec (the model's ranking alone).

Prints a table last (x dense, x cuSPARSELt, fraction of the floor) and writes JSON to DIR
(default $OUT or ./out). The floor: the kept columns' dense-equivalent flops at wgmma.sp's
measured peak (1720 TFLOP/s), or the compulsory bytes at 3 TB/s where larger.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.backends import cusparselt
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.device import DeviceSpec, device_name
from spartune.tune.model import predict
from spartune.tune.measure import interleaved
from spartune.tune.problem import Problem
from spartune.tune.tuner import fast_selection

from bench_nm_decode import SHAPES as LLAMA, each_problem, seconds  # (a sibling script: benchmarks/ is on the path)

SHAPES = {**LLAMA, "bert-ffn1": (3072, 768), "bert-ffn2": (768, 3072)}
PEAK, DRAM = 1720e12, 3.0e12
IDLE_CYCLES = 4_000_000  # ~2-3 ms idle before each call of the idle-start timing


def kept_k(pattern: str, k: int) -> int:
    parts = pattern.split(":")
    return k if len(parts) == 2 else -(-k // int(parts[2])) * 4


def floor_s(pattern, M, Kd, N) -> float:
    kk = kept_k(pattern, Kd)
    flops = 2.0 * M * kk * N  # dense-equivalent flops of the 2:4 product over the kept columns
    a_bytes = M * kk // 2 * 2 * 9 // 8  # values + metadata
    return max(flops / PEAK, (a_bytes + 2 * N * (Kd + M)) / DRAM)


def tuner_rows(A, N, dtype) -> list[dict]:
    """What the tuner measured for linear(x of N rows, A) (the DB's rows), to look into a pick later."""
    db = dispatch.get_tuner().db
    if db is None:
        return []
    key = db.key(dispatch.linear_problem(A, N, dtype))
    return [{k: r[k] for k in ("backend", "config", "seconds", "error", "predicted")} for r in db.results(key)]


def run_case(name, M, Kd, N, pattern, dtype, top, tuned, first_use=False):
    g = torch.Generator(device="cuda").manual_seed(M + Kd + N)
    w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=g)
    A = sparsify_weight(w, pattern)
    wd = A.to_dense()
    x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=g)
    out = torch.empty(N, M, device="cuda", dtype=dtype)
    row = dict(shape=name, M=M, K=Kd, N=N, pattern=pattern, dtype=str(dtype).split(".")[1])
    if first_use:
        torch.cuda.synchronize()
        start = time.perf_counter()
        st.linear(x, A)
        torch.cuda.synchronize()
        row["first_use_s"] = time.perf_counter() - start
    row["dense_s"] = seconds(lambda: F.linear(x, wd))
    paired = {"dense": lambda: F.linear(x, wd)}
    if pattern == "2:4":
        best = float("inf")
        for fn in (cusparselt.cusparselt_linear, cusparselt.cusparselt_search_linear):
            try:
                fn(A, x, out, transposed_ok=True)
                t = seconds(lambda: fn(A, x, out, transposed_ok=True))
            except cusparselt.CusparseltUnsupported:
                continue
            if t < best:
                best, paired["cusparselt"] = t, (lambda fn=fn: fn(A, x, out, transposed_ok=True))
        row["cusparselt_s"] = best
    prob = Problem("linear", A.signature, M, Kd, N, row["dtype"], A.stats(), device=device_name(0))
    spec = DeviceSpec.h100()
    configs = [c for c in K.space(prob) if c.variant == "wgmma"]
    configs.sort(key=lambda c: predict(K.features(prob, c), spec, dtype))
    timed = []
    for cfg in configs[:top or None]:
        K.launch(A, x, out, cfg)
        timed.append((seconds(lambda: K.launch(A, x, out, cfg)), cfg))
    preds = [predict(K.features(prob, c), spec, dtype) for c in configs]
    fast_set = [i for i in fast_selection(preds, list(range(len(configs)))) if i < len(timed)]
    fast_pick = min((timed[i] for i in fast_set), key=lambda t: t[0])  # (in the model's order until sorted below)
    timed.sort(key=lambda t: t[0])
    t, cfg = timed[0]
    row["fast_over_best"] = fast_pick[0] / t
    K.launch(A, x, out, cfg)
    expect = x.float() @ wd.float().T
    err = ((out.float() - expect).norm() / expect.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"{name} {pattern} N={N} {cfg}: relative error {err:.3g}")
    if pattern != "2:4":  # the x^T copy inside each V:N:M call
        from spartune.kernels.transpose import tokens_major
        row["copy_s"] = seconds(lambda: tokens_major(x, 8))
    row.update(ours_s=t, ours_config=str(cfg), configs_timed=len(timed), space=len(configs),
               floor_s=floor_s(pattern, M, Kd, N), timed=[(s, str(c)) for s, c in timed])
    paired["ours"] = lambda: K.launch(A, x, out, cfg)
    if tuned:
        st.linear(x, A)  # tunes (fast mode) on first use
        row["tuned_s"] = seconds(lambda: st.linear(x, A))
        row["tuned_pick"] = [f"{c.backend} {c.config}" for c in dispatch._states[A].chosen.values()]
        row["tuner_rows"] = tuner_rows(A, N, row["dtype"])
        paired["tuned"] = lambda: st.linear(x, A)
    row["paired"] = interleaved(paired)
    row["paired_idle"] = interleaved(paired, idle_cycles=IDLE_CYCLES)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--n", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES)[:4], choices=list(SHAPES))
    ap.add_argument("--patterns", nargs="+", default=["2:4", "64:2:8", "128:2:8", "64:2:16"])
    ap.add_argument("--top", type=int, default=6, help="wgmma configs timed per problem, the model's best first (0: all)")
    ap.add_argument("--no-tuned", action="store_true", help="skip the tuned spartune.linear")
    ap.add_argument("--first-use", action="store_true", help="time the first spartune.linear call (tuning) first")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)

    def case(name, M, Kd, n, pattern):
        row = run_case(name, M, Kd, n, pattern, dtype, args.top, not args.no_tuned, args.first_use)
        torch.cuda.empty_cache()  # (the problem's weights and layouts go before the next one's)
        return row

    rows = each_problem(SHAPES, args, case, shown=lambda row: {k: v for k, v in row.items() if k != "timed"})
    with open(os.path.join(args.out, f"bench_nm_prefill_{args.dtype}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{args.dtype}, timed in turns (measure.interleaved)\n{'shape':<13}{'N':>5} {'pattern':>8} {'dense us':>9} "
          f"{'cslt us':>8} {'ours us':>8} {'tuned us':>9} {'copy us':>8} {'x dense':>8} {'x cslt':>7} {'tuned x':>8} "
          f"{'idle x':>7} {'floor':>6}  best config   (idle x: tuned, else ours, idle before each call)")
    for r in rows:
        p = r["paired"]
        d, o = p["dense"], p["ours"]
        cs = p.get("cusparselt")
        tu = p.get("tuned")
        print(f"{r['shape']:<13}{r['N']:>5} {r['pattern']:>8} {d * 1e6:>9.1f} "
              f"{cs * 1e6 if cs else float('nan'):>8.1f} {o * 1e6:>8.1f} {tu * 1e6 if tu else float('nan'):>9.1f} "
              f"{r.get('copy_s', float('nan')) * 1e6:>8.1f} "
              f"{p['ratio:ours']:>8.2f} {p['ratio:ours'] / p['ratio:cusparselt'] if cs else float('nan'):>7.2f} {p.get('ratio:tuned', float('nan')):>8.2f} "
              f"{r['paired_idle'].get('ratio:tuned', r['paired_idle']['ratio:ours']):>7.2f} "
              f"{r['floor_s'] / o:>6.2f}  {r['ours_config']}")
    if any("first_use_s" in r for r in rows):
        print("\nfirst use (s) and fast mode / best timed, per problem:")
        for r in rows:
            tuned = r["paired"].get("tuned")
            print(f"{r['shape']:<13}{r['N']:>5} {r['pattern']:>8} first use {r.get('first_use_s', float('nan')):6.2f} s  "
                  f"tuned/best {tuned / r['paired']['ours'] if tuned else float('nan'):.3f}  "
                  f"model {r['fast_over_best']:.3f} ({r['configs_timed']} of {r['space']} timed)")


if __name__ == "__main__":
    main()
