"""Probe (session 16): v12's tail in 2-4 pieces against v8e's halves (MAX_PARTS=2), same configs,
same run, beside cuBLAS; fp16, L2 flushed (do_bench); every output checked against fp32."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_nm_decode import SHAPES, seconds  # noqa: E402
from spartune.kernels import cuda  # noqa: E402
from spartune.kernels import spmm_nm as K  # noqa: E402
from spartune.prune import sparsify_weight  # noqa: E402

_kernel = K._kernel
max_parts = {"parts": 4}


def kernel_with(config, dtype, device, gather=0, act=0):
    if max_parts["parts"] == 4:
        return _kernel(config, dtype, device, gather, act)
    key = (config, dtype, device.index, "halves")
    if key not in K._kernels:
        defines = {**dict(K._instance(config, dtype, gather, act).defines), "MAX_PARTS": 2}
        K._kernels[key] = cuda.load(cuda.instance("spmm_nm_wgmma.cu", "spmm_nm_wgmma", defines, arch_specific=True), device)
    return K._kernels[key]


K._kernel = kernel_with
CONFIGS = [K.Config(128, 256, 12, variant="wgmma", stages=5, group_m=g, cluster_m=cm) for cm in (1, 2) for g in (8, 16)]
CASES = [("llama7b-up", 2048), ("llama7b-down", 2048), ("llama13b-up", 2048), ("llama70b-up", 2048), ("llama13b-up", 8192)]
rows = []
for name, N in CASES:
    M, Kd = SHAPES[name]
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "2:4")
    wd = A.to_dense()
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    expect = x.float() @ wd.float().T
    row = dict(shape=name, N=N, dense_us=seconds(lambda: F.linear(x, wd)) * 1e6, us={})
    for cfg in CONFIGS:
        for parts in (2, 4):
            max_parts["parts"] = parts
            out.fill_(float("nan"))
            K.launch(A, x, out, cfg)
            err = ((out.float() - expect).norm() / expect.norm()).item()
            assert err < 1e-2 and not out.isnan().any(), (name, cfg, parts, err)
            row["us"][f"c{cfg.cluster_m} g{cfg.group_m} max{parts}"] = seconds(lambda: K.launch(A, x, out, cfg)) * 1e6
    rows.append(row)
    best = {p: min((t, k) for k, t in row["us"].items() if k.endswith(f"max{p}")) for p in (2, 4)}
    print(f"{name} N={N} dense {row['dense_us']:.1f} | halves {best[2][0]:.1f} ({row['dense_us'] / best[2][0]:.2f}x, "
          f"{best[2][1]}) | v12 {best[4][0]:.1f} ({row['dense_us'] / best[4][0]:.2f}x, {best[4][1]})", flush=True)
os.makedirs(os.environ.get("OUT", "out"), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "out"), "wgmma_tail.json"), "w"), indent=1)
