"""Probe (session 24): each csr_smem CTA's start, staged-x and end times (globaltimer, printed by
thread 0 under SPARTUNE_CTA_TIMES), for one cold launch, to split a call's idle SM time into ramp,
imbalance and split K's tail. One case a process (device printf is flushed at exit):

    python benchmarks/experiments/cta_times_probe.py 7b-down > out/cta_7b-down.txt; ... --report out/cta_*.txt
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

C = None
CASES = {  # name: (M, K, N, density, config args) - the tuned picks of session 24's final run
    "qkv": (4096, 4096, 8, 0.1, (8, 4096, 16, 1, 1, 16)),
    "7b-up": (11008, 4096, 8, 0.1, (8, 4096, 24, 1, 1, 8)),
    "7b-down": (4096, 11008, 8, 0.1, (8, 3680, 24, 1, 1, 8)),
    "7b-down-ck2": (4096, 11008, 8, 0.1, (8, 5504, 32, 1, 1, 16, 2)),
    "70b-up": (28672, 8192, 8, 0.1, (8, 8192, 28, 1, 1, 4)),
}


def run(name):
    import spartune as st
    from spartune.kernels import cuda, spmm_csr_smem as K
    plain = K._instance
    K._instance = lambda cfg, dtype: cuda.instance(plain(cfg, dtype).template, plain(cfg, dtype).kernel,
                                                   {**dict(plain(cfg, dtype).defines), "SPARTUNE_CTA_TIMES": 1},
                                                   arch_specific=plain(cfg, dtype).arch_specific)
    M, Kd, N, density, args = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(2):  # the second launch is the one reported (first: loads, allocations)
        flush.zero_()
        torch.cuda.synchronize()
        K.launch(A, x, out, K.Config(*args))
        torch.cuda.synchronize()


def report(paths):
    for path in paths:
        seen, last = {}, {}
        for line in open(path):
            if not line.startswith("cta "):
                continue
            bx, by, label, sm, t0, ts, t1 = (int(v) for v in line.split()[1:])
            key = (bx, by, label)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] == 2:
                last[key] = (sm, t0, ts, t1)
        if not last:
            print(path, "no CTA lines")
            continue
        base = min(v[1] for v in last.values())
        end = max(v[3] for v in last.values())
        starts = sorted((v[1] - base) / 1e3 for v in last.values())
        staged = sorted((v[2] - v[1]) / 1e3 for v in last.values() if v[2])
        mains = sorted((v[3] - v[1]) / 1e3 for k, v in last.items() if k[2] in (1, 3))
        ends = sorted((v[3] - base) / 1e3 for k, v in last.items() if k[2] in (1, 3))
        fix = [(v[3] - base) / 1e3 for k, v in last.items() if k[2] == 2]
        q = lambda a, f: a[min(len(a) - 1, int(f * len(a)))]  # noqa: E731
        print(f"{path}: span {(end - base) / 1e3:.2f} us, CTAs {len(mains)}; start min/median/max "
              f"{starts[0]:.2f}/{q(starts, .5):.2f}/{starts[-1]:.2f}; staging median {q(staged, .5):.2f} "
              f"max {staged[-1]:.2f}; CTA work min/median/max {mains[0]:.2f}/{q(mains, .5):.2f}/{mains[-1]:.2f}; "
              f"main ends min/median/p90/max {ends[0]:.2f}/{q(ends, .5):.2f}/{q(ends, .9):.2f}/{ends[-1]:.2f}"
              + (f"; fix-ups end median/max {sorted(fix)[len(fix) // 2]:.2f}/{max(fix):.2f}" if fix else ""))


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2:])
    else:
        run(sys.argv[1])
