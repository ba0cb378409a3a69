"""DEPTH again, on the x-first kernel (session 39). Session 25 refuted DEPTH 4-6 because the extra
loads, issued before x's staging, slowed the staging; since session 38 the stream's first loads
come after the staging's barrier, and csr_sm_fill_probe.py showed the 7B stream bound per SM (the
time flat from 88 to 132 CTAs): more bytes in flight per SM should now pay. The tuned picks of this
session's bench, DEPTH 3 (the kernel's) / 4 / 5 / 6, cold, in turns, 3 rounds, median; outputs
checked against float64 and against DEPTH 3 bit for bit.
    python benchmarks/experiments/csr_depth_ab.py [--compile]"""
import dataclasses
import json
import os
import statistics
import sys

import torch

from spartune.kernels import spmm_csr_smem as S

DEPTHS = (3, 4, 5, 6)
CASES = [  # (name, M, K, N, config): this session's fp16 picks
    ("qkv", 4096, 4096, 8, S.Config(nt=8, ks=4096, warps=32, gpw=1, qs=1, kw=32)),
    ("7B up", 11008, 4096, 1, S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8)),
    ("7B up", 11008, 4096, 8, S.Config(nt=8, ks=4096, warps=24, gpw=1, qs=1, kw=8)),
    ("7B up", 11008, 4096, 16, S.Config(nt=16, ks=4096, warps=24, gpw=1, qs=1, kw=4)),
    ("7B down", 4096, 11008, 8, S.Config(nt=8, ks=3680, warps=24, gpw=1, qs=1, kw=8)),
    ("7B down", 4096, 11008, 16, S.Config(nt=16, ks=3680, warps=24, gpw=1, qs=1, kw=4)),
    ("70B up", 28672, 8192, 8, S.Config(nt=8, ks=8192, warps=28, gpw=1, qs=1, kw=4)),
    ("70B up", 28672, 8192, 16, S.Config(nt=16, ks=4096, warps=28, gpw=2, qs=1, kw=4, ck=2, tpl=16)),
]
_base_instance = S._instance


def with_depth(depth):
    def inst(config, dtype, half):
        i = _base_instance(config, dtype, half)
        return i if depth == 3 else dataclasses.replace(i, defines=tuple(sorted((*i.defines, ("DEPTH", depth)))))
    return inst


def compile_only():
    from spartune.kernels.cuda import compiler as C
    from spartune.kernels.cuda.compiler import SRC_DIR, program_options, read_sources
    for name, M, K, N, cfg in CASES:
        for d in DEPTHS:
            inst = with_depth(d)(cfg, torch.float16, S.half_sums(cfg, True))
            opts = program_options(inst, C.device_arch((9, 0), inst.arch_specific))
            opts["include_path"] = [str(SRC_DIR)]
            try:
                C.nvrtc_compile(read_sources(inst.template)[inst.template], opts)
                print("ok", name, N, d, flush=True)
            except Exception as e:  # noqa: BLE001
                print("FAILED", name, N, d, str(e)[:1500], flush=True)


def main():
    import spartune as st
    from spartune.tune.measure import cold_replay
    rows = []
    for name, M, K, N, cfg in CASES:
        g = torch.Generator(device="cuda").manual_seed(M + K + N)
        w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        w = w * (torch.rand(M, K, device="cuda", generator=g) < 0.1)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
        ref = x.double() @ w.double().T
        runs, outs = {}, {}
        for d in DEPTHS:
            S._instance = with_depth(d)
            S._kernels.clear()
            out = torch.empty(N, M, device="cuda", dtype=torch.float16)
            run = S.bind(A, x, out, cfg)
            run(x, out, None, None)
            torch.cuda.synchronize()
            runs[d], outs[d] = (lambda run=run, out=out: run(x, out, None, None)), out.clone()
        S._instance = _base_instance
        S._kernels.clear()
        times = {d: [] for d in DEPTHS}
        for _ in range(3):
            for d in DEPTHS:
                times[d].append(cold_replay(runs[d]))
        r = dict(case=name, N=N, config=str(cfg))
        for d in DEPTHS:
            r[f"D{d}_us"] = statistics.median(times[d]) * 1e6
            r[f"D{d}_err"] = ((outs[d].double() - ref).norm() / ref.norm()).item()
            r[f"D{d}_same"] = bool(torch.equal(outs[d], outs[3]))
        rows.append(r)
        print(f"{name:8s} N {N:2d} " + "  ".join(f"D{d} {r[f'D{d}_us']:6.2f}" + ("" if r[f"D{d}_same"] else "!")
                                                for d in DEPTHS) + f"  err {r['D3_err']:.1e}", flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "csr_depth_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
