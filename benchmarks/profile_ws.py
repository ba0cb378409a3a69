"""Experiment: Triton's Hopper warp specialization (tl.range(..., warp_specialize=True)) on the
block-sparse TMA kernel: a producer warp group issues the TMA loads while two consumer warp
groups run the MMAs (and, persistent, the next tile's loads overlap this tile's epilogue).

    python benchmarks/profile_ws.py

Compiles for sm_90 only with BN <= 128 and num_warps=4 (BN=256 fails in the pass). Times, cold
(do_bench, L2 flushed) and hot (graph replay), the shipped best config and the WS variants.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_blocked import SHAPES, make_format  # noqa: E402
from profile_blocked import times  # noqa: E402
from spartune.kernels import spmm_blocked  # noqa: E402
from spartune.kernels._common import grouped_order  # noqa: E402


@triton.jit
def ws_kernel(x_desc, a_desc, out_desc, crow_ptr, col_ptr, M, N, n_units,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
              PERSISTENT: tl.constexpr, WS: tl.constexpr):
    n_strips = tl.cdiv(N, BN)
    n_tiles = n_units * n_strips
    step = n_tiles  # a grid of tiles: one per program
    if PERSISTENT:
        step = tl.num_programs(0)
    for tile in tl.range(tl.program_id(0), n_tiles, step, warp_specialize=WS and PERSISTENT):
        unit, strip = grouped_order(tile, n_units, n_strips, GROUP)
        n0 = strip * BN
        start = tl.load(crow_ptr + unit)
        end = tl.load(crow_ptr + unit + 1)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for p in tl.range(start, end, warp_specialize=WS and not PERSISTENT):
            c = tl.load(col_ptr + p)
            a = a_desc.load([p * BM, 0])
            xt = x_desc.load([n0, c * BK])
            acc = tl.dot(a, xt.T, acc)
        out_desc.store([n0, unit * BM], acc.to(tl.float16).T)


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [("llama7b-up", 2048, 0.1), ("llama7b-down", 2048, 0.1), ("bert-ffn1", 4096, 0.1),
             ("bert-ffn2", 4096, 0.1), ("llama7b-up", 2048, 0.5)]
    print("times in us: cold (L2 flushed) / hot (graph replay)")
    for name, N, dens in cases:
        M, K = SHAPES[name]
        w, A = make_format("block:64x64", M, K, dens, gen)
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        ref = F.linear(x.float(), w.float())
        d = times(lambda: F.linear(x, w))
        print(f"{name} N={N} d={dens}: cuBLAS {d[0]:.1f} / {d[1]:.1f}")
        shipped = [spmm_blocked.Config(256, 64, 4, 2, 8, True), spmm_blocked.Config(128, 64, 4, 2, 8, True),
                   spmm_blocked.Config(256, 64, 8, 2, 8, False), spmm_blocked.Config(128, 64, 4, 3, 8, True, True)]
        for cfg in shipped:
            t = times(lambda: spmm_blocked.launch(A, x, out, cfg))
            print(f"   shipped {t[0]:6.1f} / {t[1]:6.1f}  ({d[0] / t[0]:.2f}x / {d[1] / t[1]:.2f}x)  {cfg}")
        nnzb = A.values.shape[0]
        units = len(A.crow) - 1
        a_desc = spmm_blocked.TensorDescriptor(A.values, [nnzb * 64, 64], [64, 1], [64, 64])
        for bn, pers, ws, stages, per_sm in ((128, 1, 1, 3, 1), (128, 1, 1, 3, 2), (128, 1, 1, 4, 1), (128, 1, 1, 2, 2),
                                             (128, 0, 1, 3, 0), (128, 0, 1, 2, 0), (64, 1, 1, 3, 2), (64, 0, 1, 3, 0),
                                             (128, 1, 0, 3, 2), (128, 0, 0, 3, 0)):
            x_desc = spmm_blocked.TensorDescriptor(x, list(x.shape), list(x.stride()), [bn, 64])
            o_desc = spmm_blocked.TensorDescriptor(out, list(out.shape), list(out.stride()), [bn, 64])
            tiles = units * triton.cdiv(N, bn)
            grid = (min(tiles, sms * per_sm),) if pers else (tiles,)
            fn = lambda: ws_kernel[grid](x_desc, a_desc, o_desc, A.crow, A.col, M, N, units,  # noqa: E731
                                         BM=64, BN=bn, BK=64, GROUP=8, PERSISTENT=bool(pers), WS=bool(ws),
                                         num_warps=4, num_stages=stages)
            label = f"ws={ws} persistent={pers}x{per_sm} bn={bn} stages={stages}"
            try:
                out.fill_(float("nan"))
                fn()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                t = times(fn)
                print(f"   {t[0]:6.1f} / {t[1]:6.1f}  ({d[0] / t[0]:.2f}x / {d[1] / t[1]:.2f}x)  {label}  err {err:.1e}")
            except Exception as e:  # noqa: BLE001
                print(f"   FAILED {label}: {str(e)[:120]}")


if __name__ == "__main__":
    main()
