"""Block-sparse SpMM on one or two shapes: every config of the space, timed both ways.

    python benchmarks/profile_blocked.py [--shapes bert-ffn1,bert-ffn2] [--density 0.1] [--top 8]
    ncu ... python benchmarks/profile_blocked.py --once CONFIG_INDEX ...   # one call of those configs

"cold" is do_bench's median with the L2 flushed before every call (x and out come from DRAM);
"hot" is CUDA-graph replay (x and A stay in L2 between calls, as when the previous layer just
wrote x). cuBLAS is timed the same two ways, in the same run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_blocked import SHAPES, make_format, problem_of  # noqa: E402
from eval_tuner import Precompiler  # noqa: E402
from spartune.kernels import spmm_blocked  # noqa: E402
from spartune.tune.measure import time_callable  # noqa: E402


def times(fn):
    """(cold, hot) microseconds: do_bench's median with the L2 flushed, and graph replay."""
    return (time_callable(fn, graph=False, warmup_ms=10, rep_ms=40) * 1e6,
            time_callable(fn, graph=True, cold=False, rep_ms=40) * 1e6)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="bert-ffn1,bert-ffn2")
    p.add_argument("--fmt", default="block:64x64")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--density", type=float, default=0.1)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--min-bn", type=int, default=64)
    p.add_argument("--extra", action="store_true", help="also num_stages=1 configs (not in the space)")
    p.add_argument("--once", type=int, nargs="*", default=None, help="config indices: one call each (ncu)")
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    pre = Precompiler(14) if args.once is None else None
    for name in args.shapes.split(","):
        M, K = SHAPES[name]
        w, A = make_format(args.fmt, M, K, args.density, gen)
        x = torch.randn(args.n, K, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(args.n, M, device="cuda", dtype=torch.float16)
        ref = F.linear(x.float(), w.float())
        configs = [c for c in spmm_blocked.space(problem_of(args.fmt, A, args.n)) if c.bn >= args.min_bn]
        if args.extra:
            configs += [spmm_blocked.Config(bn, 64, wps, 1, g, tma) for bn in (64, 128, 256) for wps in (4, 8)
                        for g in (1, 8) for tma in (False, True) if 64 * bn // (32 * wps) <= 256]
        if args.once is not None:  # the same indices as a timed run with the same flags
            for i in args.once:
                spmm_blocked.launch(A, x, out, configs[i])
            torch.cuda.synchronize()
            continue
        pre.wait(pre.collect([lambda c=c: spmm_blocked.launch(A, x, out, c) for c in configs]), timeout=240)
        d_cold, d_hot = times(lambda: F.linear(x, w))
        rows = []
        for i, cfg in enumerate(configs):
            try:
                fn = lambda: spmm_blocked.launch(A, x, out, cfg)  # noqa: E731
                out.fill_(float("nan"))
                fn()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    print(f"WRONG {i} {cfg}: {err:.2e}")
                    continue
                rows.append((i, cfg, *times(fn)))
            except Exception as e:  # noqa: BLE001
                print(f"FAILED {i} {cfg}: {str(e)[:100]}")
        print(f"\n{name} {M}x{K} N={args.n} {args.fmt} density {args.density}: cuBLAS cold {d_cold:.1f} us, hot {d_hot:.1f} us; "
              f"{len(rows)}/{len(configs)} configs")
        for key, label in ((2, "cold"), (3, "hot")):
            print(f"  best by {label}:")
            for i, cfg, c, h in sorted(rows, key=lambda r: r[key])[: args.top]:
                print(f"    [{i:3d}] cold {c:6.1f} ({d_cold / c:4.2f}x)  hot {h:6.1f} ({d_hot / h:4.2f}x)  {cfg}")
    if pre:
        print(f"precompile: {pre.stats['compiled']} compiled, {pre.stats['failed']} failed, waited {pre.stats['wait_s']:.0f}s")
        pre.close()


if __name__ == "__main__":
    main()
