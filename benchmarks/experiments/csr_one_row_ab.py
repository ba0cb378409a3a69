"""One warp row per CTA (session 40, after csr_phase_stamps.py): the tuned picks at 7B and 70B put
3-7 warp rows in a CTA (kw 4-8 warps per group), so a CTA lasts as long as its longest group (the
dealing balances the CTAs' sums, not their longest groups: ~16% over the mean group at 7B), and
its other warps idle at the KW barrier (the stamps' 1.2 us tail). Here every warp of the CTA takes
turns over each of its groups (kw = warps, gpw = the warp rows it replaces: the same rows a CTA,
the same grid), one barrier a group. Not in the space (kw 4-32 powers of two, gpw 1, 2, 4). Cold
replay, in turns, 5 rounds, median; outputs against float64.
    python benchmarks/experiments/csr_one_row_ab.py"""
import json
import os
import statistics

import torch

from spartune.kernels import spmm_csr_smem as S

C = S.Config
CASES = [  # (name, M, K, N, [the session's pick, then the variants])
    ("7B up", 11008, 4096, 1, [C(8, 4096, 24, 1, 1, 8), C(8, 4096, 24, 3, 1, 24), C(8, 4096, 32, 3, 1, 32),
                               C(8, 4096, 12, 3, 1, 12)]),
    ("7B up", 11008, 4096, 8, [C(8, 4096, 24, 1, 1, 8), C(8, 4096, 24, 3, 1, 24), C(8, 4096, 32, 3, 1, 32),
                               C(8, 4096, 12, 3, 1, 12)]),
    ("7B up", 11008, 4096, 16, [C(16, 4096, 24, 1, 1, 4), C(16, 4096, 24, 6, 1, 24), C(16, 4096, 24, 3, 1, 12)]),
    ("7B down", 4096, 11008, 8, [C(8, 3680, 24, 1, 1, 8), C(8, 3680, 24, 3, 1, 24), C(8, 3680, 32, 3, 1, 32)]),
    ("70B up", 28672, 8192, 8, [C(8, 8192, 28, 1, 1, 4), C(8, 8192, 28, 7, 1, 28), C(8, 8192, 32, 7, 1, 32)]),
    ("qkv", 4096, 4096, 8, [C(8, 4096, 32, 1, 1, 32), C(8, 4096, 16, 1, 1, 16)]),
]


def main():
    import spartune as st
    from spartune.tune.measure import cold_replay

    rows = []
    for name, M, K, N, configs in CASES:
        g = torch.Generator(device="cuda").manual_seed(M + K + N)
        w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
        w = w * (torch.rand(M, K, device="cuda", generator=g) < 0.1)
        A = st.CSR.from_dense(w)
        x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
        ref = x.double() @ w.double().T
        runs, errs = [], []
        for cfg in configs:
            out = torch.full((N, M), float("nan"), device="cuda", dtype=torch.float16)
            run = S.bind(A, x, out, cfg)
            run(x, out, None, None)
            torch.cuda.synchronize()
            errs.append(((out.double() - ref).norm() / ref.norm()).item())
            runs.append(lambda run=run, out=out: run(x, out, None, None))
        times = [[] for _ in configs]
        for _ in range(5):
            for i, run in enumerate(runs):
                times[i].append(cold_replay(run) * 1e6)
        us = [statistics.median(t) for t in times]
        for cfg, t, e in zip(configs, us, errs):
            rows.append(dict(case=name, N=N, config=str(cfg), us=t, err=e, change=t / us[0] - 1))
        print(f"{name:7s} N {N:2d} " + " | ".join(
            f"w{c.warps} kw{c.kw} gpw{c.gpw} {t:6.2f}" + ("" if i == 0 else f" ({100 * (t / us[0] - 1):+.1f}%)")
            + ("" if e < 1e-3 else f" ERR {e:.1e}") for i, (c, t, e) in enumerate(zip(configs, us, errs))), flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "csr_one_row_ab.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
