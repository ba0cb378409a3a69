"""Probe (session 37): the weight's stream asked of L2 by one bulk prefetch (`PF_L2`, bytes) at the
start of the decode kernels, against none, on this session's tuned picks (H200). csr_smem: each
warp's stream past its first loads, while x is staged (the DRAM idles then: staging is 35-55% of a
CTA's life at N = 8, LOG session 24); spmm_nm's ring: each 16-row tile's A past the ring's first
chunks (a CTA holds 4-16 chunks: chunk PIPE - 1 waits a DRAM round trip after chunk 0 lands).
Timed in turns by cold replay; every output checked against float64 and against PF_L2 = 0's.
    python benchmarks/experiments/pf_l2_ab.py             # the GPU A/B
    python benchmarks/experiments/pf_l2_ab.py --compile   # NVRTC only (CPU; see scripts/compile_check.py)
"""
import json
import os
import statistics
import sys

import torch

from spartune.kernels import cuda
from spartune.kernels import spmm_csr_smem as S
from spartune.kernels import spmm_nm as K

MODE = {"pf": 0}
_csr_instance, _nm_instance = S._instance, K._instance


def _with_pf(inst):
    if not MODE["pf"]:
        return inst
    return cuda.instance(inst.template, inst.kernel, {**dict(inst.defines), "PF_L2": MODE["pf"]},
                         arch_specific=inst.arch_specific)


S._instance = lambda *a, **k: _with_pf(_csr_instance(*a, **k))
K._instance = lambda *a, **k: _with_pf(_nm_instance(*a, **k))

SC, NC = S.Config, K.Config
ALL = 1 << 24
SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "13b-up": (13824, 5120),
          "70b-up": (28672, 8192)}
# (kind, pattern, N, shape, config, PF values): the H200 picks of this session (bench logs in
# results/2026-11-28/session37), 90% CSR fp16; 70B's 94 MB stream is more than the L2 (60 MB): caps
CASES = [
    ("csr", 0.1, 8, "7b-up", SC(8, 4096, 24, 1, 1, 8), (ALL, 32 << 10)),
    ("csr", 0.1, 8, "7b-down", SC(8, 3680, 24, 1, 1, 8), (ALL, 32 << 10)),
    ("csr", 0.1, 8, "qkv", SC(8, 4096, 16, 1, 1, 16), (ALL,)),
    ("csr", 0.1, 1, "7b-up", SC(8, 4096, 24, 1, 1, 8), (ALL,)),
    ("csr", 0.1, 8, "70b-up", SC(8, 8192, 28, 1, 1, 4), (16 << 10, 48 << 10)),
    ("nm", "64:2:8", 1, "7b-up", NC(32, 8, 8, 4, stages=3, x_whole=True), (ALL,)),
    ("nm", "64:2:8", 16, "7b-up", NC(64, 16, 4, 2, stages=3), (ALL,)),
    ("nm", "2:4", 1, "13b-up", NC(32, 8, 4, 2, stages=3), (ALL,)),
]


def instance(kind, pattern, cfg, n, pf):
    MODE["pf"] = pf
    try:
        if kind == "csr":
            return S._instance(cfg, torch.float16, False)
        return K._instance(cfg, torch.float16, 0 if pattern == "2:4" else K.mma_gather(cfg, n))
    finally:
        MODE["pf"] = 0


def compile_only():
    from spartune.kernels.cuda import compiler as CC
    for kind, pattern, n, shape, cfg, pfs in CASES:
        for pf in pfs:
            inst = instance(kind, pattern, cfg, n, pf)
            opts = CC.program_options(inst, CC.device_arch((9, 0), inst.arch_specific))
            opts["include_path"] = [str(CC.SRC_DIR)]
            try:
                cubin = CC.nvrtc_compile(CC.read_sources(inst.template)[inst.template], opts)
                print(f"ok {len(cubin):7d} B {kind} {pattern} N={n} {shape} pf {pf} {cfg}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"FAILED {kind} {pattern} {shape} pf {pf}: {str(e)[-600:]}", flush=True)


def weight(kind, pattern, M, Kd):
    import spartune as st
    from spartune.prune import sparsify_weight
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    if kind == "csr":
        return st.CSR.from_dense(torch.where(torch.rand(M, Kd, device="cuda") < pattern, w, torch.zeros_like(w)))
    return sparsify_weight(w, pattern)


def bound(kind, A, x, out, cfg, pf):
    mod = S if kind == "csr" else K
    MODE["pf"] = pf
    mod._kernels.clear()
    try:
        run = mod.bind(A, x, out, cfg)
    finally:
        MODE["pf"] = 0
        mod._kernels.clear()
    return lambda: run(x, out, None, None)


def main():
    from spartune.tune.measure import cold_replay
    rows = []
    for kind, pattern, n, shape, cfg, pfs in CASES:
        M, Kd = SHAPES[shape]
        A = weight(kind, pattern, M, Kd)
        x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
        ref = x.double() @ A.to_dense().double().t()
        variants = (0, *pfs)
        outs = {pf: torch.full((n, M), float("nan"), device="cuda", dtype=torch.float16) for pf in variants}
        calls = {pf: bound(kind, A, x, outs[pf], cfg, pf) for pf in variants}
        for call in calls.values():
            call()
        errs = {pf: ((o.double() - ref).norm() / ref.norm()).item() for pf, o in outs.items()}
        times = {pf: [] for pf in variants}
        for _ in range(5):
            for pf, call in calls.items():
                times[pf].append(cold_replay(call) * 1e6)
        med = {pf: statistics.median(t) for pf, t in times.items()}
        row = dict(kind=kind, pattern=str(pattern), n=n, shape=shape, config=str(cfg), us=med, err=errs,
                   identical={pf: torch.equal(outs[0], outs[pf]) for pf in pfs})
        rows.append(row)
        parts = "  ".join(f"pf {pf >> 10} KB {med[pf]:6.1f} ({med[pf] / med[0] - 1:+.1%})" for pf in pfs)
        print(f"{kind} {str(pattern):7} N={n:<3} {shape:8} none {med[0]:6.1f}  {parts}  max err "
              f"{max(errs.values()):.1e} identical {all(row['identical'].values())}", flush=True)
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(os.path.join(out, "pf_l2_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
