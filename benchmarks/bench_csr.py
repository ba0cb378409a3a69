"""Unstructured CSR on the GPU, side by side in one run (issue 4): SpMM against cuBLAS dense and
cuSPARSE CSR (torch.sparse, fp16 and fp32), SDDMM against torch.sparse.sampled_addmm and the
dense a @ b^T; our kernels over their config space. Also measures the fp16 matrix rate, DRAM
bandwidth and the fp32 FMA rate, and reports the fraction of the floor (DESIGN.md).

    python benchmarks/bench_csr.py [--quick] [--all] [--max-configs K] [--budget-s S] [--out DIR]

By default each case measures the `--max-configs` best configs by the cost model's ranking
(spartune.tune.model, with this run's measured rates), always including the model's best of
each path; `--all` sweeps every config (slow on a fresh machine: Triton compiles each). Prints a table last,
writes JSON to DIR/bench_csr.json (DIR: --out, else $OUT, else ./out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import warnings

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

import spartune as st
from spartune.kernels import sddmm, spmm_csr
from spartune.tune.measure import cold_replay
from spartune.tune.problem import Problem

SPMM_CASES = [  # name, M, K, N
    ("llama7b-up", 11008, 4096, 2048),
    ("llama7b-down", 4096, 11008, 2048),
    ("qkv", 4096, 4096, 1),
    ("qkv", 4096, 4096, 16),
    ("qkv", 4096, 4096, 32),
    ("bert-ffn1", 3072, 768, 4096),
    ("bert-ffn2", 768, 3072, 4096),
]
DENSITIES = (0.1, 0.05, 0.02, 0.2, 0.3, 0.5)  # 90% first: the targets
SDDMM_CASES = [(L, D, d) for d in (0.05, 0.1, 0.02) for L in (4096, 8192) for D in (64, 128)]


# --------------------------------------------------------------------------------------------
# timing and device rates
# --------------------------------------------------------------------------------------------
def bench(fn, small_us: float = 20.0) -> tuple[float, bool]:
    """Median seconds of do_bench; CUDA-graph replay when a call is under `small_us`."""
    fn()
    torch.cuda.synchronize()
    t = do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e-3
    if t < small_us * 1e-6:
        try:
            return do_bench_cudagraph(fn, rep=25, return_mode="median") * 1e-3, True
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"cuda graph failed: {e}")
    return t, False


def bench_cold(fn) -> float:
    """Seconds per call with the L2 evicted before every call (spartune.tune.measure.cold_replay):
    decode weights (a few MB, or cuBLAS's 32 MB dense copy) otherwise stay in L2."""
    fn()
    torch.cuda.synchronize()
    return cold_replay(fn)


def device_rates() -> dict:
    """The two ceilings of DESIGN.md's floor, plus the fp32 FMA rate for CUDA-core paths,
    measured in this run by the cost model's calibration (one set of microbenchmarks)."""
    from spartune.tune.device import calibrate

    spec = calibrate(0)
    return {"matrix_flops": spec.mma_fp16, "dram_bw": spec.dram_bw, "fma_flops": spec.fma, "sms": spec.sms,
            "device": torch.cuda.get_device_name(0)}


# --------------------------------------------------------------------------------------------
# ranking configs when not all are measured
# --------------------------------------------------------------------------------------------
def make_ranker(rates):
    """The cost model, with this run's measured rates, ranks the configs to measure."""
    from spartune.tune import model
    from spartune.tune.device import DeviceSpec

    spec = dataclasses.replace(DeviceSpec.h100(), mma_fp16=rates["matrix_flops"], dram_bw=rates["dram_bw"],
                               fma=rates["fma_flops"])
    return (lambda prob, feats: model.predict(feats, spec, prob.dtype)), "spartune.tune.model"


def choose(configs, prob, features_fn, rank, k, all_):
    scored = sorted(configs, key=lambda c: rank(prob, features_fn(prob, c)))
    if all_ or len(scored) <= k:
        return scored, scored
    picked = scored[:k]
    for path in {c.path for c in scored}:  # the model's best 3 of every path, always
        for c in [c for c in scored if c.path == path][:3]:
            if c not in picked:
                picked.append(c)
    return picked, scored


# --------------------------------------------------------------------------------------------
# SpMM
# --------------------------------------------------------------------------------------------
def random_weight(M, K, density, gen):
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    return w * (torch.rand(M, K, device="cuda", generator=gen) < density)


def cusparse(w, xt, dtype):
    try:
        a = w.to(dtype).to_sparse_csr()
        xx = xt.to(dtype)
        return bench(lambda: a @ xx)[0]
    except Exception as e:  # noqa: BLE001
        return f"n/a: {str(e).splitlines()[0][:60]}"


def spmm_case(name, M, K, N, density, rates, gen, rank, args, dense_cache):
    w = random_weight(M, K, density, gen)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    expect = F.linear(x, w).float()
    key = (M, K, N)
    if key not in dense_cache:
        dense_cache[key] = bench(lambda: F.linear(x, w))[0]
        if N <= 32:
            dense_cache[key, "cold"] = bench_cold(lambda: F.linear(x, w))
    t_dense = dense_cache[key]
    prob = Problem("linear", "csr", M, K, N, "float16", A.stats())
    picked, ranked = choose(spmm_csr.space(prob), prob, spmm_csr.features, rank, args.max_configs, args.all)
    measured = []
    for cfg in picked:
        try:
            fn = lambda: spmm_csr.launch(A, x, out, cfg)  # noqa: E731
            fn()
            err = ((out.float() - expect).norm() / expect.norm()).item()
            if not err < 2e-2:
                measured.append(dict(config=str(cfg), path=cfg.path, error=f"wrong: rel err {err:.2e}"))
                continue
            t, graphed = bench(fn)
            measured.append(dict(config=str(cfg), path=cfg.path, s=t, graph=graphed, model_rank=ranked.index(cfg)))
        except Exception as e:  # noqa: BLE001  (compile failure: recorded, never picked)
            measured.append(dict(config=str(cfg), path=cfg.path, error=str(e).splitlines()[0][:120]))
    ok = [m for m in measured if "s" in m]
    best = min(ok, key=lambda m: m["s"]) if ok else None
    by_path = {p: min((m["s"] for m in ok if m["path"] == p), default=None) for p in spmm_csr.PATHS}
    # floor (DESIGN.md): useful flops on the matrix (or FMA) rate vs compulsory bytes on DRAM
    nnz = A.values.numel()
    bytes_ = nnz * 2 + A.col.numel() * A.col.element_size() + (M + 1) * 4 + (N * K + N * M) * 2
    floor_tc = max(2 * nnz * N / rates["matrix_flops"], bytes_ / rates["dram_bw"])
    floor_fma = max(2 * nnz * N / rates["fma_flops"], bytes_ / rates["dram_bw"])
    row = dict(kind="spmm", shape=name, M=M, K=K, N=N, density=density, nnz=nnz, dense_s=t_dense,
               cusparse16_s=None, cusparse32_s=None, ours_s=best["s"] if best else None,
               config=best["config"] if best else None, path=best["path"] if best else None,
               best_row_s=min((t for t in (by_path["row"], by_path["row_t"], by_path["ell"]) if t), default=None),
               best_row_t_s=by_path["row_t"], best_dense_s=by_path["dense"], best_expand_s=by_path.get("expand"),
               floor_tc_s=floor_tc, floor_fma_s=floor_fma, measured=measured,
               model_rank_of_best=best.get("model_rank") if best else None)
    if best:
        floor = floor_fma if best["path"] in ("row", "row_t", "ell") else floor_tc
        row.update(speedup=t_dense / best["s"], frac_floor=floor / best["s"])
        if N <= 32:
            cfg = picked[[str(c) for c in picked].index(best["config"])]
            row["ours_cold_s"] = bench_cold(lambda: spmm_csr.launch(A, x, out, cfg))
            row["dense_cold_s"] = dense_cache[key, "cold"]
    if not args.no_cusparse:
        xt = x.T.contiguous()
        row["cusparse16_s"] = cusparse(w, xt, torch.float16)
        row["cusparse32_s"] = cusparse(w, xt, torch.float32)
    return row


# --------------------------------------------------------------------------------------------
# SDDMM
# --------------------------------------------------------------------------------------------
def sddmm_case(L, D, density, rates, gen, rank, args):
    mask = torch.rand(L, L, device="cuda", generator=gen) < density
    P = st.CSR.from_dense(mask.to(torch.float16))
    a = torch.randn(L, D, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(L, D, device="cuda", dtype=torch.float16, generator=gen)
    scale = D**-0.5
    rows = torch.repeat_interleave(torch.arange(L, device="cuda"), (P.crow[1:] - P.crow[:-1]).long())
    expect = ((a.float() @ b.float().T) * scale)[rows, P.col.long()]
    t_dense = bench(lambda: a @ b.T)[0]
    prob = Problem("sddmm", "csr", L, L, D, "float16", P.stats())
    picked, ranked = choose(sddmm.space(prob), prob, sddmm.features, rank, args.max_configs, args.all)
    measured = []
    for cfg in picked:
        try:
            fn = lambda: sddmm.launch(a, b, P, cfg, scale=scale)  # noqa: E731
            v = fn().float()
            err = ((v - expect).norm() / expect.norm()).item()
            if not err < 2e-2:
                measured.append(dict(config=str(cfg), path=cfg.path, error=f"wrong: rel err {err:.2e}"))
                continue
            t, graphed = bench(fn)
            measured.append(dict(config=str(cfg), path=cfg.path, s=t, graph=graphed, model_rank=ranked.index(cfg)))
        except Exception as e:  # noqa: BLE001
            measured.append(dict(config=str(cfg), path=cfg.path, error=str(e).splitlines()[0][:120]))
    ok = [m for m in measured if "s" in m]
    best = min(ok, key=lambda m: m["s"]) if ok else None
    crow, col = P.crow.long(), P.col.long()
    cus = {}
    for dt, tag in ((torch.float32, "32"), (torch.float16, "16")):
        try:
            S = torch.sparse_csr_tensor(crow, col, torch.ones(col.numel(), device="cuda", dtype=dt), (L, L))
            aa, bt = a.to(dt), b.to(dt).T.contiguous()
            cus[tag] = bench(lambda: torch.sparse.sampled_addmm(S, aa, bt, beta=0.0, alpha=scale))[0]
        except Exception as e:  # noqa: BLE001
            cus[tag] = f"n/a: {str(e).splitlines()[0][:60]}"
    nnz = P.col.numel()
    bytes_ = 2 * L * D * 2 + nnz * (2 + 2) + (L + 1) * 4
    floor_tc = max(2 * nnz * D / rates["matrix_flops"], bytes_ / rates["dram_bw"])
    floor_fma = max(2 * nnz * D / rates["fma_flops"], bytes_ / rates["dram_bw"])
    row = dict(kind="sddmm", L=L, D=D, density=density, nnz=nnz, dense_s=t_dense, cusparse32_s=cus["32"],
               cusparse16_s=cus["16"], ours_s=best["s"] if best else None, config=best["config"] if best else None,
               path=best["path"] if best else None, floor_tc_s=floor_tc, floor_fma_s=floor_fma, measured=measured,
               model_rank_of_best=best.get("model_rank") if best else None)
    if best:
        floor = floor_fma if best["path"] == "gather" else floor_tc
        row.update(speedup=t_dense / best["s"], frac_floor=floor / best["s"])
        c32 = cus["32"] if isinstance(cus["32"], float) else None
        row["x_cusparse32"] = c32 / best["s"] if c32 else None
    return row


# --------------------------------------------------------------------------------------------
def _us(v):
    return f"{v * 1e6:.1f}" if isinstance(v, float) else "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few cases at 90%%: llama-up N=2048, qkv N=1/16/32, bert-ffn1 N=4096; one SDDMM")
    ap.add_argument("--all", action="store_true", help="measure every config of the space")
    ap.add_argument("--max-configs", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop adding cases after this many seconds (default 220; 420 with --quick)")
    ap.add_argument("--cases", default=None, help="SpMM cases NAME:N,... at 90%% (e.g. llama7b-down:2048); no SDDMM")
    ap.add_argument("--no-cusparse", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    if args.budget_s is None:
        args.budget_s = 420.0 if args.quick else 220.0
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rates = device_rates()
    print(f"{rates['device']}: fp16 matrix {rates['matrix_flops'] / 1e12:.0f} TFLOP/s, DRAM {rates['dram_bw'] / 1e12:.2f} "
          f"TB/s, fp32 FMA {rates['fma_flops'] / 1e12:.1f} TFLOP/s", flush=True)
    rank, ranker = make_ranker(rates)
    if args.cases:
        want = {(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")}
        spmm = [(n, m, k, nn, 0.1) for n, m, k, nn in SPMM_CASES if (n, nn) in want]
        sdd = []
    elif args.quick:
        quick = (("llama7b-up", 2048), ("qkv", 1), ("qkv", 16), ("qkv", 32), ("bert-ffn1", 4096))
        spmm = [(n, m, k, nn, 0.1) for n, m, k, nn in SPMM_CASES if (n, nn) in quick]
        sdd = [(4096, 64, 0.05)]
    else:
        spmm = [(n, m, k, nn, d) for d in DENSITIES for n, m, k, nn in SPMM_CASES]
        sdd = SDDMM_CASES
    rows, dense_cache, skipped = [], {}, []
    # SDDMM is interleaved after the 90% SpMM cases so that a tight budget still covers both ops
    order = [("spmm", c) for c in spmm if c[4] == 0.1] + [("sddmm", c) for c in sdd] + \
            [("spmm", c) for c in spmm if c[4] != 0.1]
    for kind, case in order:
        if time.time() - t0 > args.budget_s:
            skipped.append((kind, case))
            continue
        if kind == "spmm":
            row = spmm_case(*case, rates, gen, rank, args, dense_cache)
        else:
            row = sddmm_case(*case, rates, gen, rank, args)
        rows.append(row)
        short = {k: v for k, v in row.items() if k != "measured"}
        print(json.dumps(short), flush=True)
    if skipped:
        print(f"budget reached: {len(skipped)} cases left out: {skipped}", flush=True)
    with open(os.path.join(args.out, "bench_csr.json"), "w") as f:
        json.dump({"rates": rates, "ranker": ranker, "rows": rows, "skipped": skipped,
                   "seconds": time.time() - t0}, f, indent=1)

    print(f"\nSpMM, fp16, uniform random masks ({rates['device']}; times in us; x dense = cuBLAS / ours; "
          f"x cuSP = faster cuSPARSE (fp16 or fp32) / ours; row = best of row/row_t/ell, tc = dense path; "
          f"exp = expand path (densify + GEMM); floor% per DESIGN.md, FMA rate for row paths; cold = L2 flushed, ours/dense)")
    print(f"{'shape':<12}{'N':>5}{'dens':>6}{'dense':>9}{'cuSP16':>10}{'cuSP32':>10}{'ours':>9}{'row':>9}{'tc':>9}{'exp':>9}"
          f"{'x dense':>8}{'x cuSP':>8}{'floor%':>7}{'cold o/d':>14}  config")
    for r in rows:
        if r["kind"] != "spmm":
            continue
        cus = [c for c in (r["cusparse16_s"], r["cusparse32_s"]) if isinstance(c, float)]
        xc = min(cus) / r["ours_s"] if cus and r["ours_s"] else float("nan")
        cold = f"{_us(r.get('ours_cold_s'))}/{_us(r.get('dense_cold_s'))}" if "ours_cold_s" in r else ""
        print(f"{r['shape']:<12}{r['N']:>5}{r['density']:>6}{_us(r['dense_s']):>9}{_us(r['cusparse16_s']):>10}"
              f"{_us(r['cusparse32_s']):>10}{_us(r['ours_s']):>9}{_us(r['best_row_s']):>9}{_us(r['best_dense_s']):>9}{_us(r.get('best_expand_s')):>9}"
              f"{r.get('speedup', float('nan')):>8.2f}{xc:>8.1f}{100 * r.get('frac_floor', float('nan')):>6.0f}%{cold:>14}"
              f"  {r['config']}")
    print("\nSDDMM, fp16 in, fp32 accumulate (times in us; x cuSP32 = sampled_addmm fp32 / ours)")
    print(f"{'L':>6}{'D':>5}{'dens':>6}{'dense':>9}{'cuSP32':>10}{'cuSP16':>10}{'ours':>9}{'x cuSP32':>9}{'x dense':>8}"
          f"{'floor%':>7}  config")
    for r in rows:
        if r["kind"] != "sddmm":
            continue
        print(f"{r['L']:>6}{r['D']:>5}{r['density']:>6}{_us(r['dense_s']):>9}{_us(r['cusparse32_s']):>10}"
              f"{_us(r['cusparse16_s']):>10}{_us(r['ours_s']):>9}{(r.get('x_cusparse32') or float('nan')):>9.1f}"
              f"{r.get('speedup', float('nan')):>8.2f}{100 * r.get('frac_floor', float('nan')):>6.0f}%  {r['config']}")
    print(f"\n{time.time() - t0:.0f} s; ranking by {ranker}; JSON in {os.path.join(args.out, 'bench_csr.json')}")


if __name__ == "__main__":
    main()
