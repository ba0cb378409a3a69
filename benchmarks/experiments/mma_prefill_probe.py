"""How fast does mma.sp.sync run prefill (N = 2048) on the existing ring kernel (spmm_nm.cu, PIPE >= 3),
at tile sizes its space never offers (bn > 16)? 2:4 (GATHER 0, dense x) and V:N:M (GATHER 2, x^T rows
gathered by cp.async), each against cuBLAS and the wgmma variant's best of the model's top 4, timed cold
(do_bench flushes L2). What it answers: the fraction of mma.sp's 954 TFLOP/s peak a hand-staged ring
reaches at wide tiles, i.e. whether an mma.sp prefill path for V:N:M (x^T chunks staged densely, kept
rows picked by ldmatrix.trans addresses) could beat as_24's 1.38-1.47x.
    python benchmarks/experiments/mma_prefill_probe.py [--compile]   (--compile: NVRTC only, CPU)"""
import json
import os
import sys

import torch

from spartune.kernels import spmm_nm as K

TILES = [(bm, bn, w, ks, st) for bm in (64, 128) for bn in (64, 128) for w in (4, 8) for ks in (2, 4)
         for st in (3, 4)]


def configs(v=None):
    out = []
    for bm, bn, w, ks, st in TILES:
        if v and v % bm:
            continue
        c = K.Config(bm, bn, w, 1, ks, stages=st)
        if K._warp_grid(c) is None:
            continue
        if K._mma_smem_bytes(c, bool(v), 2048, 4096) > 220 * 1024:
            continue
        out.append(c)
    return out


def compile_only():
    from spartune.kernels.cuda import compiler as C
    from spartune.kernels.cuda.compiler import SRC_DIR, program_options, read_sources
    for gather, v in ((0, None), (2, 64)):
        for c in configs(v):
            inst = K._instance(c, torch.float16, gather, 0)
            opts = program_options(inst, C.device_arch((9, 0), inst.arch_specific))
            opts["include_path"] = [str(SRC_DIR)]
            try:
                C.nvrtc_compile(read_sources(inst.template)[inst.template], opts)
                print("ok", gather, c, K._mma_smem_bytes(c, bool(v), 2048, 4096), flush=True)
            except Exception as e:  # noqa: BLE001
                print("FAILED", gather, c, str(e)[:2000], flush=True)


def main():
    import triton.testing as tt
    import torch.nn.functional as F
    from spartune.prune import sparsify_weight
    from spartune.tune.device import H100, device_name
    from spartune.tune.model import predict
    from spartune.tune.problem import Problem
    out_dir = os.environ.get("OUT", "out")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    M, Kd, N = 11008, 4096, 2048
    for pattern in ("2:4", "64:2:8", "64:2:16"):
        torch.manual_seed(0)
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = sparsify_weight(w, pattern)
        x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
        ref = (x.double() @ A.to_dense().double().T)
        wd = A.to_dense()
        dense = tt.do_bench(lambda: F.linear(x, wd), warmup=50, rep=200)
        v = None if pattern == "2:4" else int(pattern.split(":")[0])
        kept = Kd if v is None else Kd // int(pattern.split(":")[2]) * 4
        flops = 2.0 * M * N * kept  # dense-equivalent flops of the kept 2:4 matrix
        cands = configs(v)
        # the wgmma variant's candidates, the model's top 4 (H100 spec), for reference
        prob = Problem("linear", A.signature, M, Kd, N, "float16", A.stats(), device=device_name(0))
        wg = [c for c in K.space(prob) if c.variant == "wgmma"]
        wg.sort(key=lambda c: predict(K.features(prob, c), H100, torch.float16))
        cands += wg[:4]
        from spartune.kernels import cuda
        cuda.precompile([i for c in cands for i in K.instances(prob, c)], x.device)
        for c in cands:
            out = torch.empty(N, M, device="cuda", dtype=torch.float16)
            try:
                run = K.bind(A, x, out, c)
                run(x, out, None, None)
                torch.cuda.synchronize()
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                ms = tt.do_bench(lambda: run(x, out, None, None), warmup=20, rep=100)
            except Exception as e:  # noqa: BLE001
                print("ERR", pattern, c, repr(e)[:300], flush=True)
                continue
            r = {"pattern": pattern, "config": str(c), "us": ms * 1e3, "dense_us": dense * 1e3,
                 "x_dense": dense / ms, "frac_mma_peak": flops / (ms * 1e-3) / 954e12, "err": err}
            rows.append(r)
            print(f"{pattern:8s} {ms * 1e3:8.1f} us  x{dense / ms:5.2f}  peak {r['frac_mma_peak']:.2f}  err {err:.1e}  {c}",
                  flush=True)
    json.dump(rows, open(os.path.join(out_dir, "mma_prefill_probe.json"), "w"), indent=1)
    print("\nbest per pattern:")
    for p in ("2:4", "64:2:8", "64:2:16"):
        rs = [r for r in rows if r["pattern"] == p]
        for tag, sel in (("mma", [r for r in rs if "mma'" in r["config"]]), ("wgmma", [r for r in rs if "wgmma" in r["config"]])):
            if sel:
                b = min(sel, key=lambda r: r["us"])
                print(f"{p:8s} {tag:6s} {b['us']:8.1f} us x{b['x_dense']:.2f} peak {b['frac_mma_peak']:.2f} {b['config']}")


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
