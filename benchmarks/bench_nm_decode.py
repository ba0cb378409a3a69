"""2:4 and V:N:M decode on the sparse tensor cores, side by side with cuBLAS dense, in one run:
every mma config of spmm_nm's space at N = 1 and 16 on the Llama shapes, the best
register-prefetch config (stages = 2; V:N:M: x gathered element by element) beside the best
cp.async-ring one (stages >= 3; V:N:M: rows of x^T), and what the tuned `spartune.linear` picks
(its GPU time from a graph replay, as the tuner times it, against cuBLAS timed the same way;
and its eager time, host-bound at decode). Every call is timed with the L2 flushed (triton's do_bench,
or a write past the L2 before each replay), so the weight streams from DRAM as in serving.

    python benchmarks/bench_nm_decode.py [--dtype bfloat16] [--n 1 16] [--shapes llama70b-up]
        [--patterns 2:4 64:2:8] [--out DIR] [--no-space] [--rounds R] [--rotate]

--rotate times the tuned call and cuBLAS a second way, over copies of their weight called in
turn (measure.rotated_replay: no eviction write, whose dirty lines cost cuBLAS more).

Prints a table last and writes JSON to DIR (default $OUT or ./out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.device import device_name
from spartune.tune.measure import cold_replay, rotated_replay
from spartune.tune.problem import Problem

SHAPES = {"llama7b-up": (11008, 4096), "llama7b-down": (4096, 11008), "llama13b-up": (13824, 5120),
          "llama70b-up": (28672, 8192)}


def seconds(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3


def run_case(name, M, Kd, N, dtype, pattern="2:4", space=True, rounds=1, rotate=False):
    w = torch.randn(M, Kd, device="cuda", dtype=dtype)
    A = sparsify_weight(w, pattern)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    out = torch.empty(N, M, device="cuda", dtype=dtype)
    dense = seconds(lambda: F.linear(x, w))
    expect = F.linear(x.double(), A.to_dense().double())
    prob = Problem("linear", A.signature, M, Kd, N, str(dtype).split(".")[1], A.stats(), device=device_name(0))
    best = {"registers": (float("nan"), None), "ring": (float("nan"), None)}
    for cfg in K.space(prob) if space else []:
        if cfg.variant != "mma" or cfg.bn > 16:
            continue
        K.launch(A, x, out, cfg)
        err = ((out.double() - expect).norm() / expect.norm()).item()
        if not err < 1e-2:
            raise AssertionError(f"{name} N={N} {cfg}: relative error {err:.3g}")
        t = seconds(lambda: K.launch(A, x, out, cfg))
        kind = "ring" if cfg.stages >= 3 else "registers"
        if not t >= best[kind][0]:  # (nan: none yet)
            best[kind] = (t, str(cfg))
    st.linear(x, A)  # tunes (fast mode) on first use
    # the tuned call's GPU time (replayed from a graph, L2 evicted, as the tuner times it): an
    # eager call at decode is bound by the host's ~40-80 us of Python and launches
    # (cuBLAS timed the same way, in turns with it: the median of `rounds` pairs)
    pairs = [(cold_replay(lambda: F.linear(x, w)), cold_replay(lambda: st.linear(x, A))) for _ in range(rounds)]
    dense_graph = statistics.median(p[0] for p in pairs)
    tuned = statistics.median(p[1] for p in pairs)
    tuned_eager = seconds(lambda: st.linear(x, A))
    picked = [f"{c.backend} {c.config}" for c in dispatch._states[A].chosen.values()]
    a_bytes = A.values.numel() * 2 + A.values.numel() // 8  # values + 2-bit indices
    rotated = {}
    if rotate:  # both again, over copies of their weight (no eviction write: clean lines)
        rotated = dict(dense_rotate_s=rotated_replay(lambda w: F.linear(x, w), w, w.numel() * w.element_size()),
                       tuned_rotate_s=rotated_replay(lambda A: st.linear(x, A), A, A.nbytes))
    return dict(**rotated, shape=name, M=M, K=Kd, N=N, pattern=pattern, dtype=str(dtype), dense_s=dense, registers_s=best["registers"][0],
                registers_config=best["registers"][1], ring_s=best["ring"][0], ring_config=best["ring"][1],
                tuned_s=tuned, tuned_eager_s=tuned_eager, dense_graph_s=dense_graph, tuned_pick=picked, weight_bytes=a_bytes)


def each_problem(shapes: dict, args, case, shown=lambda row: row) -> list[dict]:
    """case(name, M, K, N, pattern) for each of args.shapes, args.patterns and args.n, each row
    printed as JSON as it comes (shown(row): what of it to print)."""
    rows = []
    for name in args.shapes:
        M, Kd = shapes[name]
        for pattern in args.patterns:
            for n in args.n:
                rows.append(case(name, M, Kd, n, pattern))
                print(json.dumps(shown(rows[-1])), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--patterns", nargs="+", default=["2:4"])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--no-space", action="store_true", help="the tuned call against cuBLAS only, no sweep of the space")
    ap.add_argument("--rounds", type=int, default=1, help="tuned and cuBLAS timed in turns, the median of this many pairs")
    ap.add_argument("--rotate", action="store_true",
                    help="also time tuned and cuBLAS by rotation over weight copies (measure.rotated_replay)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    rows = each_problem(SHAPES, args, lambda name, M, Kd, n, pattern: run_case(name, M, Kd, n, dtype, pattern,
                                                                                        not args.no_space, args.rounds, args.rotate))
    with open(os.path.join(args.out, f"bench_nm_decode_{args.dtype}_{'_'.join(args.patterns).replace(':', '-')}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'shape':<14}{'pattern':>8}{'N':>4} {'dense us':>9} {'regs us':>8} {'ring us':>8} {'tuned us':>9} "
          f"{'x dense regs':>13} {'ring':>6} {'tuned':>6} {'ring TB/s':>10} {'eager us':>9} {'rotated x':>10}")
    for r in rows:
        d = r["dense_s"]
        print(f"{r['shape']:<14}{r['pattern']:>8}{r['N']:>4} {d * 1e6:>9.1f} {r['registers_s'] * 1e6:>8.1f} {r['ring_s'] * 1e6:>8.1f} "
              f"{r['tuned_s'] * 1e6:>9.1f} {d / r['registers_s']:>13.2f} {d / r['ring_s']:>6.2f} "
              f"{r['dense_graph_s'] / r['tuned_s']:>6.2f} {r['weight_bytes'] / r['ring_s'] / 1e12:>10.2f} "
              f"{r['tuned_eager_s'] * 1e6:>9.1f} "
              f"{r['dense_rotate_s'] / r['tuned_rotate_s'] if 'tuned_rotate_s' in r else float('nan'):>10.2f}")


if __name__ == "__main__":
    main()
