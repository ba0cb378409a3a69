"""Probe (session 23): the slot order's tail. v14's order (a row's slots shift off their bank
positions for good once one residue class runs out) against holes (only the slots a short class
leaves read off their position), same kernel and configs (session 22's tuned picks), in turns,
cold (L2 flushed, graph replayed), us, 90% uniform random; every output checked against the
float64 reference. v14's packer is old_sliced_ell.py (commit 224bff0). Writes $OUT/order_probe.json.
"""
from __future__ import annotations

import json
import os
import sys

import torch

import spartune as st
from spartune.kernels import spmm_csr_smem as fam
from spartune.kernels._sliced_ell import memo_key
from spartune.tune.measure import cold_replay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import old_sliced_ell  # noqa: E402

C = fam.Config
CASES = [  # shape, M, K, N, {dtype: config}
    ("qkv", 4096, 4096, 8, C(8, 4096, 16, 1, 1, 16)),
    ("7B up", 11008, 4096, 8, C(8, 4096, 24, 1, 1, 8)),
    ("7B down", 4096, 11008, 8, C(8, 3680, 24, 1, 1, 8)),
    ("70B up", 28672, 8192, 8, C(8, 8192, 28, 1, 1, 4)),
    ("qkv", 4096, 4096, 16, C(16, 4096, 16, 1, 1, 8)),
    ("7B up", 11008, 4096, 16, C(16, 4096, 24, 1, 1, 4)),
    ("7B down", 4096, 11008, 16, C(16, 3680, 24, 1, 1, 4)),
    ("70B up", 28672, 8192, 16, C(16, 4096, 28, 2, 1, 4, 2, 16)),
]


def main():
    gen = torch.Generator("cuda").manual_seed(0)
    rows = []
    for dtype in [getattr(torch, d) for d in os.environ.get("DTYPES", "float16,bfloat16").split(",")]:
        for name, M, K, N, cfg in CASES:
            w = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
            w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
            A = st.CSR.from_dense(w)
            x = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, M, device="cuda", dtype=dtype)
            ref = x.double() @ w.double().T
            _, R, P = fam._team(cfg)
            key = memo_key(R, cfg.ks, P, cfg.qs)
            copies = {"v14": old_sliced_ell._build(A, R, cfg.ks, P, cfg.qs), "holes": fam.layout(A, cfg)}

            def run(label):
                object.__setattr__(A, key, (A.values._version, copies[label]))
                fam.launch(A, x, out, cfg)

            times = {k: [] for k in copies}
            for label in copies:
                out.fill_(float("nan"))
                run(label)
                torch.cuda.synchronize()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, (label, err)
            for _ in range(3):
                for label in copies:
                    times[label].append(cold_replay(lambda: run(label)) * 1e6)
            row = dict(shape=name, N=N, dtype=str(dtype)[6:], config=str(cfg), us={k: min(v) for k, v in times.items()})
            rows.append(row)
            print(f"{row['dtype']:8s} {name:8s} N={N:2d} v14 {row['us']['v14']:.2f}  holes {row['us']['holes']:.2f}  "
                  f"({row['us']['holes'] / row['us']['v14'] - 1:+.1%})", flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "order_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
