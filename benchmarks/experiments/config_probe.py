"""Probe (session 22): csr_smem configs side by side on one weight, cold, 90%, three rounds in
turns, best of each, every output checked against the float64 product (fp16 and bf16).
    python benchmarks/experiments/config_probe.py [balance|even]
balance: 7B up (11008 x 4096) at N = 8 / 16 runs 115 CTAs of 96 rows on 132 SMs (an even share:
83.4); groups of 8 rows (qs = 4 at 8 tokens a lane, qs 2 at N = 16) and 11 warp rows (22 warps,
kw 2) make 126 CTAs of 88 rows with the same 8 lanes per row; beside the picks and a qs control.
even: 7B down (4096 x 11008) with slices of 4096 (the last 2816) against three even slices of
3680, at the tuned configs; and 13B down (5120 x 13824: 4096 x 3 + 1536 against 4 x 3456)."""
import json
import os
import sys

import torch

import spartune as st
from spartune.kernels import spmm_csr_smem as K
from spartune.tune.measure import cold_replay

Cf = K.Config
CASES = {
    "balance": {
        ("7b-up", 8): [Cf(8, 4096, 24, 1, 1, 8), Cf(8, 4096, 22, 1, 4, 2), Cf(8, 4096, 24, 1, 4, 2),
                       Cf(8, 4096, 11, 1, 4, 1), Cf(8, 4096, 22, 1, 4, 1)],
        ("7b-up", 16): [Cf(16, 4096, 24, 1, 1, 4), Cf(16, 4096, 22, 1, 2, 2), Cf(16, 4096, 24, 1, 2, 2),
                        Cf(16, 4096, 22, 1, 4, 2, 1, 16), Cf(16, 4096, 24, 1, 1, 8, 1, 16)],
    },
    "even": {
        ("7b-down", 8): [Cf(8, 4096, 24, 1, 1, 8), Cf(8, 3680, 24, 1, 1, 8), Cf(8, 4096, 32, 1, 1, 8, 3),
                         Cf(8, 3680, 32, 1, 1, 8, 3)],
        ("7b-down", 16): [Cf(16, 4096, 24, 1, 1, 4), Cf(16, 3680, 24, 1, 1, 4), Cf(16, 4096, 28, 1, 1, 4, 3),
                          Cf(16, 3680, 28, 1, 1, 4, 3)],
        ("13b-down", 8): [Cf(8, 4096, 16, 1, 1, 8), Cf(8, 3456, 16, 1, 1, 8), Cf(8, 4096, 32, 1, 1, 8, 4),
                          Cf(8, 3456, 32, 1, 1, 8, 4)],
    },
}
SHAPES = {"7b-up": (11008, 4096), "7b-down": (4096, 11008), "13b-down": (5120, 13824)}


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for (shape, N), configs in CASES[sys.argv[1] if len(sys.argv) > 1 else "even"].items():
            M, Kd = SHAPES[shape]
            w = torch.randn(M, Kd, device="cuda", dtype=dtype, generator=gen)
            w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
            A = st.CSR.from_dense(w)
            x = torch.randn(N, Kd, device="cuda", dtype=dtype, generator=gen)
            out = torch.empty(N, M, device="cuda", dtype=dtype)
            expect = x.double() @ w.double().T
            for cfg in configs:
                out.fill_(float("nan"))
                K.launch(A, x, out, cfg)
                torch.cuda.synchronize()
                err = ((out.double() - expect).norm() / expect.norm()).item()
                assert err < 1e-2 and not out.isnan().any(), (shape, N, cfg, err)
            times = [float("inf")] * len(configs)
            for _ in range(3):
                for i, cfg in enumerate(configs):
                    times[i] = min(times[i], cold_replay(lambda cfg=cfg: K.launch(A, x, out, cfg)))
            for cfg, t in zip(configs, times):
                rows.append(dict(shape=shape, N=N, dtype=str(dtype), config=str(cfg), s=t))
                print(f"{shape} N={N:<3} {str(dtype)[6:]:<9} {t*1e6:6.1f} us  {cfg}", flush=True)
            K.release_unused(A, [])
    with open(os.path.join(os.environ.get("OUT", "out"), f"config_probe_{sys.argv[1] if len(sys.argv) > 1 else 'even'}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
