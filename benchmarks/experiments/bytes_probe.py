"""Probe (session 23): 9 slots in 32 bytes (3.6 bytes a nonzero) against v14's 4 in 16, same
configs, in turns, cold (L2 flushed, graph replayed), us, fp16 and bf16, 90% uniform random,
every output checked against the float64 reference. Needs v14's kernel beside the new one as
src/spmm_csr_smem_v14.cu and its packer as old_sliced_ell.py (both from commit 224bff0).
Writes $OUT/bytes_probe.json.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

import spartune as st
from spartune.kernels import cuda, spmm_csr_smem as fam
from spartune.kernels._common import arrival_counters
from spartune.kernels.cuda.epilogue import epilogue_args, or_null
from spartune.tune.measure import cold_replay
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import old_sliced_ell  # noqa: E402

C = fam.Config
CASES = [  # shape, M, K, N, v14's tuned config, the new layout's configs (its own where v14's ks was 8192)
    ("qkv", 4096, 4096, 8, C(8, 4096, 16, 1, 1, 16), []),
    ("7B up", 11008, 4096, 8, C(8, 4096, 24, 1, 1, 8), [C(8, 4096, 28, 1, 1, 4), C(8, 4096, 24, 1, 1, 4)]),
    ("7B down", 4096, 11008, 8, C(8, 3680, 24, 1, 1, 8), [C(8, 3680, 32, 1, 1, 8, 3)]),
    ("70B up", 28672, 8192, 8, C(8, 8192, 28, 1, 1, 4), [C(8, 4096, 28, 1, 1, 4, 2), C(8, 4096, 28, 1, 1, 4),
                                                         C(8, 4096, 28, 2, 1, 4, 2)]),
    ("qkv", 4096, 4096, 16, C(16, 4096, 16, 1, 1, 8), []),
    ("7B up", 11008, 4096, 16, C(16, 4096, 24, 1, 1, 4), []),
    ("7B down", 4096, 11008, 16, C(16, 3680, 24, 1, 1, 4), []),
    ("70B up", 28672, 8192, 16, C(16, 4096, 28, 2, 1, 4, 2, 16), []),
]


def old_launch(A, x, out, config):
    """v14's launch (spmm_csr_smem.launch at 224bff0, no epilogue) on v14's kernel and copy."""
    M, K = A.shape
    N = x.shape[0]
    _, R, P = fam._team(config)
    ell = old_sliced_ell.sliced_ell(A, R, config.ks, P, config.qs)
    grid = (fam._row_blocks(ell.groups, config), ell.slices, math.ceil(N / config.nt))
    if ell.slices > 1 and config.ck == 1:
        ws = torch.empty(grid[2] * ell.slices * ell.groups * R * config.nt, dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, grid[0] * grid[2])
    else:
        ws = counters = or_null(None)
    inst = fam._instance(config, A.values.dtype)
    kernel = cuda.load(cuda.instance("spmm_csr_smem_v14.cu", "spmm_csr_smem", dict(inst.defines),
                                     arch_specific=config.ck > 1), x.device)
    kernel(grid, (32 * config.warps, 1, 1), ell.words, ell.offsets, ell.rows, x, out, or_null(None),
           or_null(None), ws, counters, M, N, K, ell.groups, ell.slices, np.int64(x.stride(0)), np.int64(x.stride(1)),
           fam._x_rows(x), *epilogue_args(out, None, None, None, 1.0), shmem=fam._smem_bytes(config))


def new_launch_d3(A, x, out, config):
    """The new layout's launch on src/spmm_csr_smem_d3.cu (three units in flight)."""
    inst = fam._instance(config, A.values.dtype)
    kernel = cuda.load(cuda.instance("spmm_csr_smem_d3.cu", "spmm_csr_smem", dict(inst.defines),
                                     arch_specific=config.ck > 1), x.device)
    saved = fam._kernels.get((config, A.values.dtype, x.device.index))
    fam._kernels[(config, A.values.dtype, x.device.index)] = kernel
    try:
        fam.launch(A, x, out, config)
    finally:
        fam._kernels[(config, A.values.dtype, x.device.index)] = saved


def check(fn, out, ref):
    out.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err


def main():
    gen = torch.Generator("cuda").manual_seed(0)
    rows = []
    for dtype in [getattr(torch, d) for d in os.environ.get("DTYPES", "float16,bfloat16").split(",")]:
        for name, M, K, N, old_cfg, new_cfgs in CASES:
            w = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
            w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
            A = st.CSR.from_dense(w)
            x = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, M, device="cuda", dtype=dtype)
            ref = x.double() @ w.double().T
            fns = {"v14 " + str(old_cfg): lambda c=old_cfg: old_launch(A, x, out, c)}
            for c in ([old_cfg] if old_cfg.ks <= 4096 else []) + new_cfgs:
                fns["new " + str(c)] = lambda c=c: fam.launch(A, x, out, c)
            if old_cfg.ks <= 4096:  # the new layout with three units in flight (d3)
                fns["d3 " + str(old_cfg)] = lambda: new_launch_d3(A, x, out, old_cfg)
            for fn in fns.values():
                check(fn, out, ref)
            times = {k: [] for k in fns}
            for _ in range(2):  # in turns
                for k, fn in fns.items():
                    times[k].append(cold_replay(fn) * 1e6)
            row = dict(shape=name, N=N, dtype=str(dtype)[6:], us={k: min(v) for k, v in times.items()})
            rows.append(row)
            print(f"{row['dtype']:8s} {name:8s} N={N:2d} " + "  ".join(
                f"{k.split(' ')[0]} {k.split('(')[1][:-1].replace(', ', ',')[:48]}: {v:.1f}" for k, v in row["us"].items()),
                flush=True)
            del A
    with open(os.path.join(os.environ.get("OUT", "."), "bytes_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
