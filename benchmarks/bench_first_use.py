"""First use of a new shape: the first `spartune.linear` call per problem (issue 14: under 10 s
with compiles, under 1 s once the cubin cache holds the kernels). One process per run; run
several on one SPARTUNE_CACHE_DIR to see a cold cache, then a warm one:

    python benchmarks/bench_first_use.py --shape llama7b-up     # cold: calibration, compiles
    spartune tune --compile-all --shape 11008,4096,16 ...       # (or) every config compiled ahead
    python benchmarks/bench_first_use.py --shape llama13b-up    # new shapes, kernels compiled

Per problem: the first call's wall time, each candidate the tuner timed (wall time and its
measured seconds, or why it was not run), NVRTC compiles and the winner's check; --profile adds
cProfile's top entries. The process first runs small 2:4 and V:N:M calls (a process that has run
a model: Triton's x^T kernel and the CUDA driver loaded). A table last; JSON to --out.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch

import spartune as st
from spartune import dispatch
from spartune.kernels.cuda import compiler
from spartune.kernels.transpose import tokens_major
from spartune.prune import sparsify_weight
from spartune.tune import tuner as T

from bench_nm_decode import SHAPES  # (a sibling script: benchmarks/ is on the path)

events: list[dict] = []
_measure, _passes, _nvrtc = T.Tuner._measure, T.Tuner._passes, compiler.nvrtc_compile


def _timed(kind, fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, {"kind": kind, "wall_s": time.perf_counter() - start}


def measure(self, c, cfg, predicted, bound=None):
    row, ev = _timed("measure", _measure, self, c, cfg, predicted, bound)
    events.append({**ev, "backend": c.backend, "config": str(c.config), "seconds": row["seconds"]})
    return row


def passes(self, c, i, cfg, predicted, rows):
    ok, ev = _timed("check", _passes, self, c, i, cfg, predicted, rows)
    events.append({**ev, "backend": c.backend, "config": str(c.config), "ok": ok})
    return ok


def nvrtc(source, options):
    cubin, ev = _timed("compile", _nvrtc, source, options)
    events.append(ev)
    return cubin


T.Tuner._measure, T.Tuner._passes, compiler.nvrtc_compile = measure, passes, nvrtc


def warm_process(dtype):
    for pattern, n in (("2:4", 8), ("64:2:8", 64)):
        w = sparsify_weight(torch.randn(128, 256, device="cuda", dtype=dtype), pattern)
        st.linear(torch.randn(n, 256, device="cuda", dtype=dtype), w)
    tokens_major(torch.randn(64, 256, device="cuda", dtype=dtype))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama7b-up", choices=list(SHAPES))
    ap.add_argument("--patterns", nargs="+", default=["2:4", "64:2:8"])
    ap.add_argument("--n", type=int, nargs="+", default=[16, 2048])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--profile", action="store_true", help="print cProfile's top entries per problem")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    M, K = SHAPES[args.shape]
    warm_process(dtype)
    rows = []
    for pattern in args.patterns:
        A = sparsify_weight(torch.randn(M, K, device="cuda", dtype=dtype), pattern)
        for n in args.n:
            x = torch.randn(n, K, device="cuda", dtype=dtype)
            events.clear()
            prof = cProfile.Profile() if args.profile else None
            torch.cuda.synchronize()
            start = time.perf_counter()
            if prof:
                prof.enable()
            st.linear(x, A)
            torch.cuda.synchronize()
            if prof:
                prof.disable()
            wall = time.perf_counter() - start
            picked = [f"{c.backend} {c.config}" for c in dispatch._states[A].chosen.values()][-1]
            print(f"\n=== {args.shape} {pattern} N={n} {args.dtype}: first use {wall:.3f} s, picked {picked}")
            for e in events:
                res = e.get("seconds", e.get("ok"))
                res = f"{res * 1e6:.1f} us" if isinstance(res, float) else res
                print(f"  {e['kind']:8s} {e['wall_s'] * 1e3:8.1f} ms  {e.get('backend', ''):18s} {e.get('config', '')[:72]:72s} {res}")
            if prof:
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
                print("\n".join(buf.getvalue().splitlines()[6:40]))
            kinds = lambda k: [e for e in events if e["kind"] == k]  # noqa: E731
            rows.append(dict(shape=args.shape, M=M, K=K, N=n, pattern=pattern, dtype=args.dtype, first_use_s=wall,
                             measuring_s=sum(e["wall_s"] for e in kinds("measure")), measured=len(kinds("measure")),
                             compiles=len(kinds("compile")), picked=picked, events=list(events)))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"first_use_{args.shape}_{args.dtype}.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'shape':<13} {'pattern':>8} {'N':>5}  first use s  measuring s  measured  compiles")
    for r in rows:
        print(f"{r['shape']:<13} {r['pattern']:>8} {r['N']:>5} {r['first_use_s']:12.3f} {r['measuring_s']:12.3f} "
              f"{r['measured']:9d} {r['compiles']:9d}")


if __name__ == "__main__":
    main()
