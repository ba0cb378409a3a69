"""Probe (issue 14, session 13): where the V:N:M wgmma gather loses to the 2:4 TMA kernel.
Llama-7B up (11008x4096), N = 2048, fp16, L2 flushed, bm=128 (x^T read in place: spmm's layout,
no transpose in the timing). Variants, compiled with extra defines of spmm_nm_wgmma.cu:
- 2:4, K-major x boxes by TMA (the production path) and MN-major x^T boxes by TMA (B_MN_TMA=1):
  does wgmma.sp with B transposed run slower?
- 128:2:4 (every column kept: the gather over the whole of K, the same math as 2:4), 128:2:8,
  64:2:8 through the gather: 4 / 2 / 1 gathering warps (GATHER_WARPS: fewer per-thread barrier
  arrivals), and without the consumers' proxy fence (PROXY_FENCE=0: its cost; correctness is
  checked anyway).
"""
import torch
from triton.testing import do_bench

from spartune.kernels import cuda
from spartune.kernels import spmm_nm as K
from spartune.kernels.cuda.epilogue import epilogue_args, or_null
from spartune.prune import sparsify_weight

torch.manual_seed(0)
M, Kd, N = 11008, 4096, 2048
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
X = torch.randn(Kd, N, device="cuda", dtype=torch.float16)  # spmm's layout: x = X.T, read in place
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
_instance = K._instance


def with_defines(extra):
    K._kernels.clear()
    K._instance = lambda c, d, g=0: cuda.compiler.Instance(*(lambda i: (i.template, i.kernel, tuple(sorted(
        dict(i.defines, **extra).items())), i.arch_specific, i.options))(_instance(c, d, g)))


def mn_tma_launch(A, cfg):
    values, meta, stages_k = K.packed_wgmma(A, cfg.bm)
    kernel = K._kernel(cfg, values.dtype, X.device, 0)
    x_map = cuda.tensor_map_2d(X, 64, 64)
    rest = epilogue_args(out, None, None, None, 1.0)
    grid = (values.shape[0] * -(-N // cfg.bn), 1, 1)
    return lambda: kernel(grid, (K.WGMMA_THREADS, 1, 1), x_map, values, meta, K.NULL, K.NULL, 0, 0, 1, out,
                          or_null(None), or_null(None), M, N, stages_k, values.shape[0], cfg.group_m, *rest,
                          shmem=K._smem_bytes(cfg))


def timed(label, A, fn):
    fn()
    ref = X.T.float() @ A.to_dense().float().T
    err = ((out.float() - ref).norm() / ref.norm()).item()
    t = do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
    print(f"{label:<52} {t:8.1f} us  rel.err {err:.1e}", flush=True)


weights = {p: sparsify_weight(w, p) for p in ("2:4", "128:2:4", "128:2:8", "64:2:8")}
xk = X.T.contiguous()
import sys
ONLY_WARPS = "--warps" in sys.argv  # the gathering-warps variants only
for bn, stages in ((256, 4), (128, 5)):
    cfg = K.Config(128, bn, 12, variant="wgmma", stages=stages, group_m=16)
    with_defines({})
    timed(f"2:4 K-major TMA bn={bn}", weights["2:4"], lambda: K.launch(weights["2:4"], xk, out, cfg))
    with_defines({"B_MN_TMA": 1})
    timed(f"2:4 MN-major TMA bn={bn}", weights["2:4"], mn_tma_launch(weights["2:4"], cfg))
    for extra in ({"GATHER_WARPS": 2}, {"GATHER_WARPS": 1}) if ONLY_WARPS else ({}, {"PROXY_FENCE": 0}, {"GATHER_WARPS": 2}, {"GATHER_WARPS": 1}):
        if extra.get("GATHER_WARPS") == 1 and bn == 256:
            continue  # (its 64 rows per thread spill)
        with_defines(extra)
        for p in ("128:2:4", "128:2:8", "64:2:8"):
            c = cfg if p != "64:2:8" else K.Config(128, bn, 12, variant="wgmma", stages=3 if bn == 256 else 5, group_m=16)
            timed(f"{p} gather {extra or 'base'} bn={bn}", weights[p], lambda: K.launch(weights[p], X.T, out, c))
