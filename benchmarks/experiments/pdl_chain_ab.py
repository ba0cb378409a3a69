"""Probe (session 37, lead 2; not yet run): programmatic dependent launch (PDL) for decode layers
back to back. A chain of Llama-7B up / down layers at N = 1 (each layer's output is the next one's
x: a real data dependency), pruned 2:4 or 64:2:8, run by spmm_nm's ring at the tuned configs,
captured in one CUDA graph and replayed after a write past the L2 (measure.cold_replay), three ways:
  plain   the kernel as shipped, launched by cuLaunchKernel;
  reorder the variant below (EDITS: each CTA issues the weight's first ring chunks, then
          `griddepcontrol.wait`, then x; `griddepcontrol.launch_dependents` after its main loop),
          launched plainly (the wait is then a no-op: the cost of the reorder alone);
  pdl     the variant launched by cuLaunchKernelEx with programmatic stream serialization, so a
          layer's CTAs start, and its weight streams, while the layer before finishes.
Every chain's output is checked against float64 (the chain in dense arithmetic) and against the
plain chain's (bit-identical expected: the math and its order do not change).
    python benchmarks/experiments/pdl_chain_ab.py            # the GPU A/B (~1-2 minutes)
    python benchmarks/experiments/pdl_chain_ab.py --compile  # NVRTC only (CPU; see scripts/compile_check.py)
Prediction (LOG, session 37 leads): pdl -1 to -2 us a layer (of ~12-20), reorder within +-2%.
Hazard that the library would have to handle (not this probe): a weight repacked in place by the
kernel just before must not be read before the wait.
"""
import atexit
import ctypes
import json
import os
import statistics
import sys

import torch

from spartune.kernels import cuda
from spartune.kernels import spmm_nm as K
from spartune.kernels.cuda import compiler as CC
from spartune.kernels.cuda import runtime as RT

# spmm_nm.cu's text -> the PDL variant: (anchor, replacement) pairs, each anchor found once
EDITS = [
    ('''#include "epilogue.cuh"
#include "mma_sp.cuh"
''', '''#include "epilogue.cuh"
#include "mma_sp.cuh"
// PDL (probe): wait for the grid before (its writes visible) before touching x or out; let the next
// grid start once this one's main loop is done
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
'''),
    ('''  stage_xw();
  cp_async_commit();
#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p) {
    if (p < chunks) issue_a(p);
    cp_async_commit();
  }
  cp_async_wait<PIPE - 1>();
''', '''#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p)
    if (p < chunks) issue_a(p);  // (PDL: the weight's first chunks before the wait, in x's group)
  griddep_wait();
  stage_xw();
  cp_async_commit();
#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p) cp_async_commit();  // (empty: the groups' count as before)
  cp_async_wait<PIPE - 1>();
'''),
    ('''#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p) {
    if (p < chunks) issue(p);
    cp_async_commit();
  }
#endif
''', '''#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p)
    if (p < chunks) issue_a(p);  // (PDL: the weight's first chunks before the wait, in chunk 0's group)
  griddep_wait();
#pragma unroll
  for (int p = 0; p < PIPE - 1; ++p) {
    if (p < chunks) issue_x(p);
    cp_async_commit();
  }
#endif
'''),
    ('''  cp_async_wait<0>();
  __syncthreads();  // the reduction below reuses the stages
''', '''  griddep_launch();
  cp_async_wait<0>();
  __syncthreads();  // the reduction below reuses the stages
'''),
    ('''#else
  load_a(0);
''', '''#else
  griddep_wait();  // (the register path: no overlap, only the wait)
  load_a(0);
'''),
]


def variant_source() -> str:
    src = (CC.SRC_DIR / "spmm_nm.cu").read_text()
    for anchor, replacement in EDITS:
        if src.count(anchor) != 1:
            raise SystemExit(f"anchor moved in spmm_nm.cu: {anchor[:70]!r}")
        src = src.replace(anchor, replacement)
    return src


VARIANT = CC.SRC_DIR / "spmm_nm_pdl.cu"
VARIANT.write_text(variant_source())
atexit.register(lambda: VARIANT.unlink(missing_ok=True))
MODE = {"kernel": False, "launch": False}
_instance = K._instance


def instance(config, dtype, gather=0, act=0, res=False):
    inst = _instance(config, dtype, gather, act, res)
    if not MODE["kernel"] or config.variant != "mma":
        return inst
    return cuda.instance("spmm_nm_pdl.cu", inst.kernel, dict(inst.defines), arch_specific=inst.arch_specific)


K._instance = instance


# cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h, CUDA 12+)
class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("allowed", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shmem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


PROGRAMMATIC_STREAM_SERIALIZATION = 6
_ATTR = _Attr(id=PROGRAMMATIC_STREAM_SERIALIZATION)
_ATTR.value.allowed = 1
_plain_launch = RT.LoadedKernel._launch
_launch_ex = None


def _launch(self, launch_args, pointers):
    global _launch_ex
    if not MODE["launch"]:
        return _plain_launch(self, launch_args, pointers)
    if _launch_ex is None:
        _launch_ex = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        _launch_ex.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _launch_ex.restype = ctypes.c_int
    handle, gx, gy, gz, bx, by, bz, shmem = launch_args
    cfg = _Config((ctypes.c_uint * 3)(gx, gy, gz), (ctypes.c_uint * 3)(bx, by, bz), shmem,
                  RT._current_stream_handle(self.device_index), ctypes.pointer(_ATTR), 1)
    err = _launch_ex(ctypes.byref(cfg), handle, pointers, None)
    if err:
        raise RuntimeError(f"cuLaunchKernelEx failed ({err}) for {self.instance.describe()}")


RT.LoadedKernel._launch = _launch

UP, DOWN = (11008, 4096), (4096, 11008)
LAYERS = 8  # up, down, up, down, ...


def compile_only():
    import tempfile

    from spartune.kernels.cuda.cache import CubinCache
    cache = CubinCache(tempfile.mkdtemp())
    C = K.Config
    cases = [(C(32, 8, 8, 4, stages=3, x_whole=True), 4), (C(32, 8, 4, 2, stages=3), 0),
             (C(16, 8, 8, 8, stages=3, x_whole=True), 4), (C(64, 8, 4, 1, stages=3), 2), (C(32, 8, 4, 2, stages=2), 1)]
    for cfg, gather in cases:
        MODE["kernel"] = True
        try:
            inst = K._instance(cfg, torch.float16, gather)
        finally:
            MODE["kernel"] = False
        try:  # (the runtime's own path: NVRTC through a cubin cache, here a throwaway one)
            cubin = cache.get(inst, CC.device_arch((9, 0), inst.arch_specific), CC.nvrtc_version())
            print(f"ok {len(cubin):7d} B gather {gather} {cfg}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"FAILED gather {gather} {cfg}: {str(e)[-600:]}", flush=True)


def chain(pattern: str):
    """The layers' weights, buffers and tuned configs, and the float64 reference of the chain."""
    import spartune as st
    from spartune import dispatch
    from spartune.prune import sparsify_weight
    kept = 0.5 if pattern == "2:4" else 0.25
    weights, xs = [], [torch.randn(1, UP[1], device="cuda", dtype=torch.float16)]
    configs = []
    for i in range(LAYERS):
        M, Kd = UP if i % 2 == 0 else DOWN
        A = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=torch.float16) / (Kd * kept) ** 0.5, pattern)
        st.linear(torch.randn(1, Kd, device="cuda", dtype=torch.float16), A)  # tunes (fast mode) on first use
        picked = [c.config for c in dispatch._states[A].chosen.values() if c.backend == "nm"]
        if not picked or picked[0].variant != "mma" or picked[0].cluster_m > 1:
            raise SystemExit(f"{pattern} layer {i}: the tuner picked {list(dispatch._states[A].chosen.values())}, "
                             "not an mma config without clusters")
        weights.append(A)
        configs.append(picked[0])
        xs.append(torch.full((1, M), float("nan"), device="cuda", dtype=torch.float16))
    ref = xs[0].double()
    for A in weights:
        ref = ref @ A.to_dense().double().t()
    return weights, xs, configs, ref


def bound_chain(weights, xs, configs, variant):
    MODE["kernel"] = variant != "plain"
    K._kernels.clear()
    try:
        runs = [K.bind(A, xs[i], xs[i + 1], cfg) for i, (A, cfg) in enumerate(zip(weights, configs))]
    finally:
        MODE["kernel"] = False
        K._kernels.clear()

    def call():
        MODE["launch"] = variant == "pdl"
        try:
            for i, run in enumerate(runs):
                run(xs[i], xs[i + 1], None, None)
        finally:
            MODE["launch"] = False
    return call


def main():
    from spartune.tune.measure import cold_replay
    rows = []
    for pattern in ("64:2:8", "2:4"):
        weights, xs, configs, ref = chain(pattern)
        variants = ("plain", "reorder", "pdl")
        calls = {v: bound_chain(weights, xs, configs, v) for v in variants}
        outs, errs = {}, {}
        for v, call in calls.items():
            for x in xs[1:]:
                x.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            outs[v] = xs[-1].clone()
            errs[v] = ((outs[v].double() - ref).norm() / ref.norm()).item()
        times = {v: [] for v in variants}
        for _ in range(5):
            for v, call in calls.items():
                times[v].append(cold_replay(call) * 1e6 / LAYERS)
        med = {v: statistics.median(t) for v, t in times.items()}
        row = dict(pattern=pattern, layers=LAYERS, configs=[str(c) for c in configs], us_per_layer=med, err=errs,
                   identical={v: torch.equal(outs["plain"], outs[v]) for v in variants})
        rows.append(row)
        print(f"{pattern:7} N=1, {LAYERS} layers 7B up/down, us a layer: plain {med['plain']:6.2f}  reorder "
              f"{med['reorder']:6.2f} ({med['reorder'] / med['plain'] - 1:+.1%})  pdl {med['pdl']:6.2f} "
              f"({med['pdl'] / med['plain'] - 1:+.1%})  err {max(errs.values()):.1e}  identical "
              f"{all(row['identical'].values())}", flush=True)
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    json.dump(rows, open(os.path.join(out, "pdl_chain_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    compile_only() if "--compile" in sys.argv else main()
