"""Does the tuner's new eviction (a read of twice the L2, measure.cold_replay(clean=True)) evict,
and does it time calls as a model's layers find them (measure.rotated_replay)? Each case four
ways, in turns over 3 rounds: write (the benchmarks' cold_replay), clean, rotated, warm (graph
replay, no eviction)."""
import json
import os
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

import spartune as st
from spartune.tune.measure import cold_replay, rotated_replay

gen = torch.Generator(device="cuda").manual_seed(0)


def weight(M, K, density):
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    return w * (torch.rand(M, K, device="cuda", generator=gen) < density)


cases = {}
for name, M, K, N in (("qkv", 4096, 4096, 8), ("7B up", 11008, 4096, 1)):
    w = weight(M, K, 1.0)
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
    cases[f"dense {name} N={N}"] = (lambda v, x=x: F.linear(x, v), w, w.numel() * 2)
    A = st.CSR.from_dense(weight(M, K, 0.1))
    st.linear(x, A)
    cases[f"csr 90% {name} N={N}"] = (lambda B, x=x: st.linear(x, B), A, A.nbytes)
rows = {k: {"write": [], "clean": [], "rotated": [], "warm": []} for k in cases}
for r in range(3):
    for name, (call, operand, nbytes) in cases.items():
        fn = lambda call=call, operand=operand: call(operand)  # noqa: E731
        rows[name]["write"].append(cold_replay(fn) * 1e6)
        rows[name]["clean"].append(cold_replay(fn, clean=True) * 1e6)
        rows[name]["rotated"].append(rotated_replay(call, operand, nbytes, rounds=3) * 1e6)
        rows[name]["warm"].append(do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3)
result = {k: {how: statistics.median(v) for how, v in d.items()} for k, d in rows.items()}
print(f"{'case':24s} {'write':>8s} {'clean':>8s} {'rotated':>8s} {'warm':>8s}  (us, medians of 3 rounds)")
for k, d in result.items():
    print(f"{k:24s} {d['write']:8.1f} {d['clean']:8.1f} {d['rotated']:8.1f} {d['warm']:8.1f}")
if os.environ.get("OUT"):
    json.dump(dict(medians=result, rounds=rows), open(os.path.join(os.environ["OUT"], "evict_clean_check.json"), "w"), indent=1)
