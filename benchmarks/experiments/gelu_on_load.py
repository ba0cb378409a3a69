"""One-off probe (issue 18): BERT's FFN (block:64 90%, N = 4096) with GELU in ffn1's epilogue
(today) against GELU applied by ffn2 as it loads ffn1's output (the input prologue: ffn1 writes
x @ W1^T, ffn2 reads gelu(h + b1)); timed as inside a CUDA graph, best of a slice of the space
for each kernel.   python benchmarks/experiments/gelu_on_load.py"""
import torch
from triton.testing import do_bench_cudagraph

import spartune as st
from spartune import reference as ref
from spartune.kernels import spmm_blocked
from spartune.tune.problem import Problem

N, D, H = 4096, 768, 3072
gen = torch.Generator(device="cuda").manual_seed(0)


def weight(m, k):
    keep = torch.rand(m // 64, k // 64, generator=gen, device="cuda") < 0.1
    w = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen) * keep.repeat_interleave(64, 0).repeat_interleave(64, 1)
    return st.BlockSparse.from_dense(w / k ** 0.5 * 10, (64, 64))


W1, W2 = weight(H, D), weight(D, H)
x = torch.randn(N, D, device="cuda", dtype=torch.float16, generator=gen)
b1, b2 = (torch.randn(m, device="cuda", dtype=torch.float16, generator=gen) for m in (H, D))
h = torch.empty(N, H, device="cuda", dtype=torch.float16)
y = torch.empty(N, D, device="cuda", dtype=torch.float16)


def best(A, m, k, run):
    prob = Problem("linear", "block:64x64", m, k, N, "float16", A.stats())
    cfgs = [c for c in spmm_blocked.space(prob) if c.bn in (64, 128) and c.num_stages in (2, 3, 4) and c.group == 8]
    return min((do_bench_cudagraph(lambda: run(cfg), rep=20) * 1e3, str(cfg)) for cfg in cfgs)


rows = {
    "ffn1 +b1 +gelu (today)": best(W1, H, D, lambda c: spmm_blocked.launch(W1, x, h, c, bias=b1, activation="gelu")),
    "ffn2 +b2 (today)": best(W2, D, H, lambda c: spmm_blocked.launch(W2, h, y, c, bias=b2)),
    "ffn1 no epilogue": best(W1, H, D, lambda c: spmm_blocked.launch(W1, x, h, c)),
    "ffn2 +b2, gelu(h + b1) on load": best(W2, D, H, lambda c: spmm_blocked.launch(W2, h, y, c, bias=b2,
                                                                                  prologue=(b1, "gelu"))),
}
for name, (t, cfg) in rows.items():
    print(f"{name}: {t:.1f} us ({cfg})", flush=True)
print(f"today {rows['ffn1 +b1 +gelu (today)'][0] + rows['ffn2 +b2 (today)'][0]:.1f} us, on load "
      f"{rows['ffn1 no epilogue'][0] + rows['ffn2 +b2, gelu(h + b1) on load'][0]:.1f} us")
# the two routes agree with the float64 reference
spmm_blocked.launch(W1, x, h, spmm_blocked.Config(128, 64, 4, 2), bias=b1, activation="gelu")
spmm_blocked.launch(W2, h, y, spmm_blocked.Config(128, 64, 4, 2), bias=b2)
today = y.clone()
spmm_blocked.launch(W1, x, h, spmm_blocked.Config(128, 64, 4, 2))
spmm_blocked.launch(W2, h, y, spmm_blocked.Config(128, 64, 4, 2), bias=b2, prologue=(b1, "gelu"))
expect = ref.linear(ref.linear(x, W1, b1, "gelu").half(), W2, b2)
err = lambda t: ((t.double() - expect).norm() / expect.norm()).item()  # noqa: E731
print(f"rel err today {err(today):.2e}, on load {err(y):.2e}")
