"""Probe: where the first `spartune.linear` call of a new shape spends its time (issue 14's
"first use under 1 s once the cubin cache is warm"). Run twice on one SPARTUNE_CACHE_DIR:

    python benchmarks/experiments/first_use.py --shape llama7b-up    # process 1: compiles, calibrates
    python benchmarks/experiments/first_use.py --shape llama13b-up   # process 2: cubins warm, new shapes

Per case: the first call's wall time, NVRTC compiles, each measured candidate's wall time and
its measured seconds, the winner's check, and cProfile's top entries (cumulative)."""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import spartune as st  # noqa: E402
from spartune.kernels.cuda import compiler  # noqa: E402
from spartune.prune import sparsify_weight  # noqa: E402
from spartune.tune import tuner as T  # noqa: E402
from bench_nm_decode import SHAPES  # noqa: E402

log = []
_measure, _passes, _compile = T.Tuner._measure, T.Tuner._passes, compiler.nvrtc_compile


def measure(self, c, cfg, predicted, bound=None):
    t = time.perf_counter()
    row = _measure(self, c, cfg, predicted, bound)
    log.append(("measure", c.backend, str(c.config)[:70], time.perf_counter() - t, row["seconds"], row["error"]))
    return row


def passes(self, c, i, cfg, predicted, rows):
    t = time.perf_counter()
    ok = _passes(self, c, i, cfg, predicted, rows)
    log.append(("check", c.backend, str(c.config)[:70], time.perf_counter() - t, ok, None))
    return ok


def nvrtc(source, options):
    t = time.perf_counter()
    out = _compile(source, options)
    log.append(("compile", "", "", time.perf_counter() - t, None, None))
    return out


T.Tuner._measure, T.Tuner._passes, compiler.nvrtc_compile = measure, passes, nvrtc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama7b-up")
    ap.add_argument("--patterns", nargs="+", default=["2:4", "64:2:8"])
    ap.add_argument("--n", type=int, nargs="+", default=[16, 2048])
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    M, K = SHAPES[args.shape]
    for pattern, n in (("2:4", 8), ("64:2:8", 64)):  # a process that has run a model: Triton and the CUDA driver warm
        st.linear(torch.randn(n, 256, device="cuda", dtype=dtype), sparsify_weight(torch.randn(128, 256, device="cuda", dtype=dtype), pattern))
    from spartune.kernels.transpose import tokens_major
    tokens_major(torch.randn(64, 256, device="cuda", dtype=dtype))  # (V:N:M prefill's x^T copy, Triton)
    summary = []
    for pattern in args.patterns:
        A = sparsify_weight(torch.randn(M, K, device="cuda", dtype=dtype), pattern)
        for n in args.n:
            x = torch.randn(n, K, device="cuda", dtype=dtype)
            log.clear()
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            t = time.perf_counter()
            prof.enable()
            st.linear(x, A)
            torch.cuda.synchronize()
            prof.disable()
            wall = time.perf_counter() - t
            print(f"\n=== {args.shape} {pattern} N={n}: first use {wall:.3f} s")
            for kind, backend, cfg, s, res, err in log:
                print(f"  {kind:8s} {s*1e3:8.1f} ms  {backend:18s} {cfg:70s} {res if not isinstance(res, float) else f'{res*1e6:.1f} us'} {err or ''}")
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(28)
            print("\n".join(buf.getvalue().splitlines()[6:40]))
            from spartune import dispatch
            print("  chosen:", [f"{c.backend} {c.config}" for c in dispatch._states[A].chosen.values()][-1:])
            summary.append((pattern, n, wall, sum(r[3] for r in log if r[0] == "measure"),
                            sum(1 for r in log if r[0] == "measure"), sum(1 for r in log if r[0] == "compile")))
    print("\npattern      N  first use s  measuring s  measured  compiles")
    for p, n, w, m, k, c in summary:
        print(f"{p:8s} {n:6d} {w:11.3f} {m:12.3f} {k:9d} {c:9d}")


if __name__ == "__main__":
    main()
