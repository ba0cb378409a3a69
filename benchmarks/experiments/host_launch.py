"""One-off probe: host time of one tuned block:64 linear call (BERT ffn1, N = 4096, bias + GELU)
and of its parts: the SparseLinear module, the operator, spartune.linear, Triton's
JITFunction launch with the same arguments, and the compiled kernel's own `run` with the
arguments bound once. Back-to-back calls, then a sync; us per call.
    python benchmarks/experiments/host_launch.py"""
import cProfile
import pstats
import time

import torch
import triton

import spartune as st
from spartune.kernels import spmm_blocked

torch.manual_seed(0)
M, K, N = 3072, 768, 4096
lin = torch.nn.Linear(K, M).cuda().half()
layer = st.SparseLinear.from_linear(lin, "block:64", 0.9)
A = layer.weight
x = torch.randn(N, K, device="cuda", dtype=torch.float16)
bias = lin.bias.detach()


def per_call(fn, n=300):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize()
    return host * 1e6


with torch.no_grad():
    rows = {}
    rows["module(x)"] = per_call(lambda: layer(x))
    rows["spartune.linear(x, A, bias, gelu)"] = per_call(lambda: st.linear(x, A, bias, activation="gelu"))
    # the tuned launchers themselves
    from spartune import dispatch, ops
    s = dispatch.state(A, ops._CHECKS["linear"])
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    print("launchers:", list(s.launchers), flush=True)
    for key, launch in s.launchers.items():
        act = key[4]
        rows[f"launchers[{act}](...)"] = per_call(lambda: launch(A, x, out, bias, act, None, 1.0))
    cfg = spmm_blocked.Config(bn=128, bk=64, num_warps=4, num_stages=2, group=8)
    rows["spmm_blocked.launch (pointer path)"] = per_call(lambda: spmm_blocked.launch(A, x, out, cfg, bias=bias, activation="gelu"))
    cfg_t = spmm_blocked.Config(bn=128, bk=64, num_warps=4, num_stages=2, group=8, tma=True)
    rows["spmm_blocked.launch (TMA path)"] = per_call(lambda: spmm_blocked.launch(A, x, out, cfg_t, bias=bias, activation="gelu"))
    # the compiled kernel's run with everything bound once (pointer path)
    M_, K_, bm, n_units, shuffled, perm, stride_a, a_desc = spmm_blocked._weight_args(A)
    grid = (n_units * triton.cdiv(N, cfg.bn),)
    args = (x, A.values, A.crow, A.col, perm, out, bias, out, out, M_, K_, N, n_units, x.stride(0), x.stride(1),
            out.stride(0), out.stride(1), out.stride(0), out.stride(1), stride_a, 1.0)
    kw = dict(BM=bm, BN=cfg.bn, BK=A.block[1], GROUP=cfg.group, SHUFFLED=False, EVEN_K=True, EVEN_N=True,
              HAS_BIAS=True, ACT=2, HAS_RES=False, HAS_PRE=False, PRE_ACT=0)
    k = spmm_blocked._blocked_spmm_kernel[grid](*args, **kw, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    rows["JITFunction[grid](...)"] = per_call(lambda: spmm_blocked._blocked_spmm_kernel[grid](
        *args, **kw, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    from triton.runtime import driver
    dev = torch.cuda.current_device()
    stream = driver.active.get_current_stream(dev)
    bound = list(args) + list(kw.values())
    sig = list(spmm_blocked._blocked_spmm_kernel.signature.parameters)
    full = dict(zip(sig[:len(args)], args)); full.update(kw)
    vals = [full[p] for p in sig]
    rows["CompiledKernel.run (bound)"] = per_call(lambda: k.run(grid[0], 1, 1, stream, k.function, k.packed_metadata,
                                                               None, None, None, *vals))
    rows["get_current_stream"] = per_call(lambda: driver.active.get_current_stream(dev))
    rows["torch.empty(N, M)"] = per_call(lambda: torch.empty(N, M, device="cuda", dtype=torch.float16))
    rows["F.linear dense"] = per_call(lambda: torch.nn.functional.linear(x, lin.weight, bias))
    for name, us in rows.items():
        if us is not None:
            print(f"{name:<42} {us:7.1f} us", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        layer(x)
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
