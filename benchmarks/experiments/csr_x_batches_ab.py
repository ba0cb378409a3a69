"""Probe (session 38): csr_smem's staging of x at N = 16, where a warp stages its ~11 units of x in
three batches one after another (X_MAX_BATCH = 4 at NT = 16: load a batch, wait, store, next), so
the staging is three L2 round trips in a row. Two variants, spmm_csr_smem.cu edited at run time:
  batch8     X_MAX_BATCH 8 at NT = 16 too (two batches; more registers, maybe spills)
  pipelined  the batches double-buffered: batch b + 1's loads fly while batch b is stored
Timed in turns by cold replay on the tuned picks of this session's run; every output checked
against float64 and against the kernel's (bit-identical expected).
    python benchmarks/experiments/csr_x_batches_ab.py             # the GPU A/B
    python benchmarks/experiments/csr_x_batches_ab.py --compile   # NVRTC only (CPU)
Prediction (LOG, session 38): pipelined -6 to -9% at 7B N = 16, 70B -2 to -3%, N = 8 unchanged
(one batch); batch8 -3 to -6% at 7B if it does not spill.
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
from spartune.kernels.cuda import runtime as RT

BATCH = "constexpr int X_MAX_BATCH = NT == 8 ? 8 : 4;  // more spills under the 64-register cap\n"
LOOP = """  for (int u0 = warp; u0 < X_UNITS; u0 += WARPS * X_BATCH) {
    XBatch v;
    load_x_batch(v, u0, WIDE, x, N, K, sxn, n0, k0, lane);
    store_x_batch(v, u0, WIDE, xs, lane);
  }
"""
PIPELINED = """  constexpr int STEP = WARPS * X_BATCH;
  XBatch a, b;
  int u0 = warp;
  load_x_batch(a, u0, WIDE, x, N, K, sxn, n0, k0, lane);
  for (; u0 < X_UNITS; u0 += 2 * STEP) {  // (warp-uniform) the next batch's loads fly while one is stored
    if (u0 + STEP < X_UNITS) load_x_batch(b, u0 + STEP, WIDE, x, N, K, sxn, n0, k0, lane);
    store_x_batch(a, u0, WIDE, xs, lane);
    if (u0 + STEP >= X_UNITS) break;
    if (u0 + 2 * STEP < X_UNITS) load_x_batch(a, u0 + 2 * STEP, WIDE, x, N, K, sxn, n0, k0, lane);
    store_x_batch(b, u0 + STEP, WIDE, xs, lane);
  }
"""


def variant_source(name: str) -> str:
    src = (CC.SRC_DIR / "spmm_csr_smem.cu").read_text()
    for anchor in (BATCH, LOOP):
        if src.count(anchor) != 1:
            raise SystemExit(f"anchor moved in spmm_csr_smem.cu: {anchor[:60]!r}")
    if name == "batch8":
        return src.replace(BATCH, "constexpr int X_MAX_BATCH = 8;\n")
    return src.replace(LOOP, PIPELINED)


VARIANTS = ("batch8", "pipelined")
for v in VARIANTS:
    (CC.SRC_DIR / f"spmm_csr_smem_{v}.cu").write_text(variant_source(v))
atexit.register(lambda: [(CC.SRC_DIR / f"spmm_csr_smem_{v}.cu").unlink(missing_ok=True) for v in VARIANTS])
MODE = {"on": None}
_instance = S._instance


def instance(config, dtype, half):
    inst = _instance(config, dtype, half)
    if MODE["on"] is None:
        return inst
    return cuda.instance(f"spmm_csr_smem_{MODE['on']}.cu", inst.kernel, dict(inst.defines),
                         arch_specific=inst.arch_specific)


S._instance = instance
SC = S.Config
SHAPES = {"qkv": (4096, 4096), "7b-up": (11008, 4096), "7b-down": (4096, 11008), "70b-up": (28672, 8192)}
# (N, shape, config): the tuned picks of this session's bench_csr_decode run (H200, 90%, fp16)
CASES = [(16, "7b-up", SC(16, 4096, 24, 1, 1, 4)), (16, "7b-down", SC(16, 3680, 24, 1, 1, 4)),
         (16, "70b-up", SC(16, 4096, 28, 2, 1, 4, 2, 16)), (8, "7b-up", SC(8, 4096, 24, 1, 1, 8))]


def compile_only():
    import tempfile

    from spartune.kernels.cuda.cache import CubinCache
    cache = CubinCache(tempfile.mkdtemp())
    for v in VARIANTS:
        for n, shape, cfg in CASES:
            for dt in (torch.float16, torch.bfloat16):
                MODE["on"] = v
                try:
                    inst = S._instance(cfg, dt, S.half_sums(cfg, dt == torch.float16))
                finally:
                    MODE["on"] = None
                try:
                    cubin = cache.get(inst, CC.device_arch((9, 0), inst.arch_specific), CC.nvrtc_version())
                    print(f"ok {v:9} {len(cubin):7d} B N={n} {shape} {dt}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"FAILED {v} N={n} {shape}: {str(e)[-600:]}", flush=True)


def bound(A, x, out, cfg, variant):
    MODE["on"] = variant
    S._kernels.clear()
    try:
        run = S.bind(A, x, out, cfg)
    finally:
        MODE["on"] = None
        S._kernels.clear()
    return lambda: run(x, out, None, None)


def main():
    import spartune as st
    from spartune.tune.measure import cold_replay
    rows = []
    names = (None, *VARIANTS)
    for n, shape, cfg in CASES:
        M, Kd = SHAPES[shape]
        w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
        A = st.CSR.from_dense(torch.where(torch.rand(M, Kd, device="cuda") < 0.1, w, torch.zeros_like(w)))
        x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
        ref = x.double() @ A.to_dense().double().t()
        outs = {v: torch.full((n, M), float("nan"), device="cuda", dtype=torch.float16) for v in names}
        calls = {v: bound(A, x, outs[v], cfg, v) for v in names}
        for call in calls.values():
            call()
        errs = {v: ((o.double() - ref).norm() / ref.norm()).item() for v, o in outs.items()}
        times = {v: [] for v in names}
        for _ in range(5):
            for v, call in calls.items():
                times[v].append(cold_replay(call) * 1e6)
        med = {str(v): statistics.median(t) for v, t in times.items()}
        regs = {}
        for v in names:  # registers and spilled (local) bytes a thread
            MODE["on"] = v
            try:
                attrs = RT.load(S._instance(cfg, torch.float16, S.half_sums(cfg, True))).kernel.attributes
                regs[str(v)] = (attrs.num_regs, attrs.local_size_bytes)
            finally:
                MODE["on"] = None
        row = dict(n=n, shape=shape, config=str(cfg), us=med, regs_local=regs, err=max(errs.values()),
                   identical={v: torch.equal(outs[None], outs[v]) for v in VARIANTS})
        rows.append(row)
        base = med["None"]
        print(f"csr 90% N={n:<3} {shape:8} kernel {base:6.1f} " + " ".join(
            f"{v} {med[v]:6.1f} ({med[v] / base - 1:+.1%})" for v in VARIANTS)
            + f" err {row['err']:.1e} identical {all(row['identical'].values())} regs/local {regs}", flush=True)
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(os.path.join(out, "csr_x_batches_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
