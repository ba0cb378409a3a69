"""Block-sparse / Shfl-BW SpMM on the GPU, side by side with cuBLAS dense, PyTorch's Triton BSR
kernel and cuSPARSE BSR, in one run. Sweeps our config space per case (or its model top-k).

    python benchmarks/bench_blocked.py [--quick | --shfl] [--dtype bfloat16] [--out DIR]

--shfl: issue 17's comparison, Shfl-BW (spmm layout) beside block-sparse of the same height and
density at its best (linear layout, TMA), on Llama-7B, BERT-base and ViT-L MLP shapes.

Prints a table last and writes JSON to DIR (default $OUT or ./out).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph

import spartune as st
from spartune.kernels import spmm_blocked
from spartune.tune.device import H100
from spartune.tune.model import predict
from spartune.tune.problem import Problem

SHAPES = {  # name: (M, K)
    "llama7b-up": (11008, 4096),
    "llama7b-down": (4096, 11008),
    "bert-ffn1": (3072, 768),
    "bert-ffn2": (768, 3072),
    "vit-l-fc1": (4096, 1024),
    "vit-l-fc2": (1024, 4096),
}
DTYPE = torch.float16  # --dtype


def bench(fn, graph: bool) -> float:
    """Median seconds; CUDA graph replay for short kernels (METHOD.md)."""
    fn()
    torch.cuda.synchronize()
    t = do_bench(fn, warmup=10, rep=40, return_mode="median")
    if graph and t < 0.05:
        try:
            t = min(t, do_bench_cudagraph(fn, rep=40, return_mode="median"))
        except Exception:
            pass
    return t * 1e-3


def device_rates() -> dict:
    """DESIGN.md's two ceilings, measured in this run by the cost model's calibration."""
    from spartune.tune.device import calibrate

    spec = calibrate(0)
    return {"matrix_flops": spec.mma_fp16, "dram_bw": spec.dram_bw}


def block_mask_weight(M, K, bm, bk, density, gen):
    br, bc = triton.cdiv(M, bm), triton.cdiv(K, bk)
    keep = torch.rand(br, bc, generator=gen, device="cuda") < density
    mask = keep.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:M, :K]
    return (torch.randn(M, K, device="cuda", generator=gen) * mask).to(DTYPE)


def make_format(fmt: str, M, K, density, gen):
    kind, _, rest = fmt.partition(":")
    if kind == "block":
        bm, bk = (int(v) for v in rest.split("x"))
        w = block_mask_weight(M, K, bm, bk, density, gen)
        return w, st.BlockSparse.from_dense(w, (bm, bk))
    v = int(rest)
    # uniform random: each group of V rows keeps a random set of columns (rows in random order)
    w = block_mask_weight(M, K, v, 1, density, gen)
    perm = torch.randperm(M, device="cuda", generator=gen).to(torch.int32)
    w_perm = torch.empty_like(w)
    w_perm[perm.long()] = w
    return w_perm, st.ShuffledBlock.from_dense(w_perm, v, perm)


def problem_of(fmt, A, N):
    layout = "spmm" if fmt.startswith("shfl") else "linear"  # as run_case lays x out
    return Problem("linear", fmt, A.shape[0], A.shape[1], N, str(DTYPE).split(".")[1], A.stats(), layout=layout)


def run_case(name, fmt, M, K, N, density, rates, gen, max_configs, quick):
    w, A = make_format(fmt, M, K, density, gen)
    if fmt.startswith("shfl"):
        # Shfl-BW gathers rows of X: measured in the spmm layout (X (K, N), read in place
        # through the strided view x = X.T); the linear layout gathers single elements.
        x = torch.randn(K, N, device="cuda", generator=gen).to(DTYPE).T
        out = torch.empty(M, N, device="cuda", dtype=DTYPE).T  # Y (M, N), read as out = Y.T
    else:
        x = torch.randn(N, K, device="cuda", generator=gen).to(DTYPE)
        out = torch.empty(N, M, device="cuda", dtype=DTYPE)
    graph = N <= 64
    ref = F.linear(x, w)
    t_dense = bench(lambda: F.linear(x, w), graph)
    prob = problem_of(fmt, A, N)
    configs = spmm_blocked.space(prob)
    if len(configs) > max_configs:  # inside the lease: the cost model's top picks plus a spread
        ranked = sorted(configs, key=lambda c: predict(spmm_blocked.features(prob, c), H100, prob.dtype))
        top = ranked[: max_configs * 2 // 3]
        rest = [c for c in configs if c not in top]
        step = max(1, len(rest) // max(1, max_configs - len(top)))
        configs = top + rest[::step][: max_configs - len(top)]
    best, best_cfg, errors = float("inf"), None, 0
    for cfg in configs:
        try:
            fn = lambda: spmm_blocked.launch(A, x, out, cfg)  # noqa: E731
            fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            if not err < 1e-2:
                errors += 1
                continue
            t = bench(fn, graph)
        except Exception as e:  # compile failure (e.g. out of shared memory): recorded, not picked
            errors += 1
            warnings.warn(f"{name} {fmt} {cfg}: {e}")
            continue
        if t < best:
            best, best_cfg = t, cfg
    row = dict(shape=name, M=M, K=K, N=N, fmt=fmt, density=density, nnz=A.nnz, dense_s=t_dense, ours_s=best,
               config=str(best_cfg), failed_configs=errors, configs=len(configs))
    # floor (DESIGN.md): useful flops on the matrix rate vs compulsory bytes on DRAM bandwidth
    s = A.stats()
    idx_bytes = A.col.numel() * A.col.element_size() + A.crow.numel() * 4
    bytes_ = A.nnz * 2 + idx_bytes + (N * K + N * M) * 2
    floor = max(2 * A.nnz * N / rates["matrix_flops"], bytes_ / rates["dram_bw"])
    row.update(floor_s=floor, speedup=t_dense / best, frac_floor=floor / best, items_mean=s.items_mean)
    if fmt.startswith("block"):
        bm, bk = A.block
        wb = w.to_sparse_bsr((bm, bk)) if M % bm == 0 and K % bk == 0 else None
        xt = x.T.contiguous()
        if wb is not None:
            from torch.sparse._triton_ops import bsr_dense_mm

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    row["torch_bsr_s"] = bench(lambda: bsr_dense_mm(wb, xt), graph)
                except Exception as e:
                    row["torch_bsr_s"], row["torch_bsr_err"] = None, str(e)[:80]
                try:
                    row["cusparse_bsr_s"] = bench(lambda: wb @ xt, graph)
                except Exception as e:
                    row["cusparse_bsr_s"], row["cusparse_bsr_err"] = None, str(e)[:80]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shfl", action="store_true")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--heights", default="64", help="Shfl-BW heights V, comma-separated (32, 64)")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--max-configs", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args()
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rates = device_rates()
    print(f"matrix {rates['matrix_flops'] / 1e12:.0f} TFLOP/s, DRAM {rates['dram_bw'] / 1e12:.2f} TB/s", flush=True)
    cases = []
    if args.quick:
        cases = [("llama7b-up", "block:64x64", 2048, 0.1), ("llama7b-down", "block:64x64", 2048, 0.1),
                 ("llama7b-up", "block:64x64", 16, 0.1), ("bert-ffn1", "block:64x64", 4096, 0.1),
                 ("llama7b-up", "shfl:64", 2048, 0.1), ("llama7b-up", "block:64x64", 2048, 0.5)]
    elif args.shfl:
        for name, n in (("llama7b-up", 2048), ("llama7b-down", 2048), ("bert-ffn1", 4096), ("bert-ffn2", 4096),
                        ("vit-l-fc1", 8192), ("vit-l-fc2", 8192), ("llama7b-up", 16), ("llama7b-down", 16)):
            for v in args.heights.split(","):
                cases += [(name, f"block:{v}x{v}", n, args.density), (name, f"shfl:{v}", n, args.density)]
    else:
        for density in (0.1, 0.5, 0.05, 0.3, 0.2):
            for name, n in (("llama7b-up", 2048), ("llama7b-down", 2048), ("bert-ffn1", 4096), ("bert-ffn2", 4096),
                            ("llama7b-up", 16), ("llama7b-down", 16)):
                for fmt in ("block:64x64", "shfl:64", "block:32x32", "block:128x128", "shfl:32"):
                    if density not in (0.1, 0.5) and fmt not in ("block:64x64", "shfl:64"):
                        continue
                    cases.append((name, fmt, n, density))
    rows, t0 = [], time.time()
    for name, fmt, n, density in cases:
        if time.time() - t0 > args.budget_s:
            print(f"budget reached; {len(cases) - len(rows)} cases left out", flush=True)
            break
        M, K = SHAPES[name]
        row = run_case(name, fmt, M, K, n, density, rates, gen, args.max_configs, args.quick)
        rows.append(row)
        print(json.dumps(row), flush=True)
    tag = f"_shfl_{args.dtype}" if args.shfl else ""
    with open(os.path.join(args.out, f"bench_blocked{tag}.json"), "w") as f:
        json.dump({"rates": rates, "rows": rows}, f, indent=1)
    print(f"\n{'shape':<13}{'N':>5} {'fmt':<14}{'dens':>5} {'dense us':>9} {'ours us':>8} {'x dense':>8} {'floor%':>7} "
          f"{'torchBSR':>9} {'cuSP BSR':>9}  config")
    for r in rows:
        tb = r.get("torch_bsr_s")
        cb = r.get("cusparse_bsr_s")
        print(f"{r['shape']:<13}{r['N']:>5} {r['fmt']:<14}{r['density']:>5} {r['dense_s'] * 1e6:>9.1f} {r['ours_s'] * 1e6:>8.1f} "
              f"{r['speedup']:>8.2f} {100 * r['frac_floor']:>6.0f}% {tb * 1e6 if tb else float('nan'):>9.1f} "
              f"{cb * 1e6 if cb else float('nan'):>9.1f}  {r['config']}")
    if args.shfl:  # Shfl-BW time over block-sparse time, same shape, height and density
        block = {(r["shape"], r["N"], r["fmt"].split(":")[1].split("x")[0]): r["ours_s"] for r in rows
                 if r["fmt"].startswith("block")}
        print(f"\n{'shape':<13}{'N':>5} {'V':>4} {'block us':>9} {'shfl us':>8} {'shfl/block':>11} {'shfl x dense':>13}")
        for r in rows:
            if r["fmt"].startswith("shfl") and (r["shape"], r["N"], r["fmt"][5:]) in block:
                b = block[(r["shape"], r["N"], r["fmt"][5:])]
                print(f"{r['shape']:<13}{r['N']:>5} {r['fmt'][5:]:>4} {b * 1e6:>9.1f} {r['ours_s'] * 1e6:>8.1f} "
                      f"{r['ours_s'] / b:>11.2f} {r['speedup']:>13.2f}")


if __name__ == "__main__":
    main()
