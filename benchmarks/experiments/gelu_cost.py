"""One-off probe (issue 18): what each epilogue activation costs BERT's ffn1 SpMM (3072x768,
block:64 90%, N = 4096, bias), timed as inside a CUDA graph (no flush), over a slice of the
space.   python benchmarks/experiments/gelu_cost.py"""
import torch
from triton.testing import do_bench_cudagraph

import spartune as st
from spartune.kernels import spmm_blocked
from spartune.tune.problem import Problem

N, M, K = 4096, 3072, 768
gen = torch.Generator(device="cuda").manual_seed(0)
keep = torch.rand(M // 64, K // 64, generator=gen, device="cuda") < 0.1
w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen) * keep.repeat_interleave(64, 0).repeat_interleave(64, 1)
A = st.BlockSparse.from_dense(w, (64, 64))
x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
bias = torch.randn(M, device="cuda", dtype=torch.float16, generator=gen)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
prob = Problem("linear", "block:64x64", M, K, N, "float16", A.stats())
configs = [c for c in spmm_blocked.space(prob) if c.bn in (64, 128) and c.num_stages == 2 and c.group == 8]
for act in (None, "relu", "gelu", "gelu_tanh", "silu"):
    times = []
    for cfg in configs:
        times.append((do_bench_cudagraph(lambda: spmm_blocked.launch(A, x, out, cfg, bias=bias, activation=act),
                                         rep=20) * 1e3, str(cfg)))
    times.sort()
    print(f"act={act}: best {times[0][0]:.1f} us ({times[0][1]}), then " + ", ".join(f"{t:.1f}" for t, _ in times[1:4]),
          flush=True)
