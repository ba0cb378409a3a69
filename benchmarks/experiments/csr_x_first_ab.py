"""Probe (session 37, lead 1; not yet run): csr_smem with the weight stream's first loads issued
after x is staged (the CTA barrier) instead of before, so x's lines, which every CTA of a K slice
needs first, do not queue at the DRAM behind ~4 MB of the stream's first requests (x prefetch,
DEPTH and PF_L2, each more early weight traffic, all slowed the staging: LOG sessions 24, 25, 37).
The variant is spmm_csr_smem.cu with the edit below applied at run time (spmm_csr_smem_xfirst.cu in
the package's src/ while the probe runs). Timed in turns by cold replay on session 37's H200 picks;
every output checked against float64 and against the kernel's.
    python benchmarks/experiments/csr_x_first_ab.py             # the GPU A/B
    python benchmarks/experiments/csr_x_first_ab.py --compile   # NVRTC only (CPU; see scripts/compile_check.py)
Prediction (LOG, session 37 leads): staging -1 to -2 us, the loop's start +0.5-1 us: N = 8 at 7B
-0.5 to -1 us (-4 to -8%), qkv alike, 70B within 2%.
"""
import atexit
import json
import os
import statistics
import sys

import torch

from spartune.kernels import cuda
from spartune.kernels import spmm_csr_smem as S
from spartune.kernels.cuda import compiler as CC

LOADS = """  uint4 buf[DEPTH];
#pragma unroll
  for (int j = 0; j < DEPTH; ++j) buf[j] = c + j * KW < total ? load_stream(wp + (c + j * KW) * STEP) : zero;
"""
BARRIER = """  __syncthreads();

  const spartune::Epilogue ep{"""


def variant_source() -> str:
    """spmm_csr_smem.cu with the stream's first DEPTH loads moved behind x's staging barrier."""
    src = (CC.SRC_DIR / "spmm_csr_smem.cu").read_text()
    for anchor in (LOADS, BARRIER):
        if src.count(anchor) != 1:
            raise SystemExit(f"anchor moved in spmm_csr_smem.cu: {anchor[:60]!r}")
    first_loads = LOADS.split("\n", 1)[1]  # (the declaration stays where it was)
    src = src.replace(LOADS, "  uint4 buf[DEPTH];  // (x first: the stream's first loads follow the staging's barrier)\n")
    return src.replace(BARRIER, "  __syncthreads();\n" + first_loads + BARRIER.removeprefix("  __syncthreads();\n"))


VARIANT = CC.SRC_DIR / "spmm_csr_smem_xfirst.cu"
VARIANT.write_text(variant_source())
atexit.register(lambda: VARIANT.unlink(missing_ok=True))
MODE = {"on": False}
_instance = S._instance


def instance(config, dtype, half):
    inst = _instance(config, dtype, half)
    if not MODE["on"]:
        return inst
    return cuda.instance("spmm_csr_smem_xfirst.cu", inst.kernel, dict(inst.defines), arch_specific=inst.arch_specific)


S._instance = instance
SC = S.Config
SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
# (N, shape, config): the tuned picks of session 37 (H200, 90%, fp16; results/2026-11-28/session37)
CASES = [(8, "7b-up", SC(8, 4096, 24, 1, 1, 8)), (8, "7b-down", SC(8, 3680, 24, 1, 1, 8)),
         (8, "qkv", SC(8, 4096, 16, 1, 1, 16)), (1, "7b-up", SC(8, 4096, 24, 1, 1, 8)),
         (16, "7b-up", SC(16, 4096, 24, 1, 1, 4)), (8, "70b-up", SC(8, 8192, 28, 1, 1, 4))]


def compile_only():
    import tempfile

    from spartune.kernels.cuda.cache import CubinCache
    cache = CubinCache(tempfile.mkdtemp())
    for n, shape, cfg in CASES:
        MODE["on"] = True
        try:
            inst = S._instance(cfg, torch.float16, S.half_sums(cfg, True))
        finally:
            MODE["on"] = False
        try:  # (the runtime's own path: NVRTC through a cubin cache, here a throwaway one)
            cubin = cache.get(inst, CC.device_arch((9, 0), inst.arch_specific), CC.nvrtc_version())
            print(f"ok {len(cubin):7d} B N={n} {shape} {cfg}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"FAILED N={n} {shape}: {str(e)[-600:]}", flush=True)


def bound(A, x, out, cfg, on):
    MODE["on"] = on
    S._kernels.clear()
    try:
        run = S.bind(A, x, out, cfg)
    finally:
        MODE["on"] = False
        S._kernels.clear()
    return lambda: run(x, out, None, None)


def main():
    import spartune as st
    from spartune.tune.measure import cold_replay
    rows = []
    for n, shape, cfg in CASES:
        M, Kd = SHAPES[shape]
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = st.CSR.from_dense(torch.where(torch.rand(M, Kd, device="cuda") < 0.1, w, torch.zeros_like(w)))
        x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
        ref = x.double() @ A.to_dense().double().t()
        outs = {on: torch.full((n, M), float("nan"), device="cuda", dtype=torch.float16) for on in (False, True)}
        calls = {on: bound(A, x, outs[on], cfg, on) for on in (False, True)}
        for call in calls.values():
            call()
        errs = {on: ((o.double() - ref).norm() / ref.norm()).item() for on, o in outs.items()}
        times = {on: [] for on in calls}
        for _ in range(5):
            for on, call in calls.items():
                times[on].append(cold_replay(call) * 1e6)
        med = {on: statistics.median(t) for on, t in times.items()}
        row = dict(n=n, shape=shape, config=str(cfg), kernel_us=med[False], x_first_us=med[True],
                   err=errs[True], identical=torch.equal(outs[False], outs[True]))
        rows.append(row)
        print(f"csr 90% N={n:<3} {shape:8} kernel {med[False]:6.1f} x first {med[True]:6.1f} "
              f"({med[True] / med[False] - 1:+.1%}) err {errs[True]:.1e} identical {row['identical']}", flush=True)
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(os.path.join(out, "csr_x_first_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
