"""The user path for CSR decode: what spartune.linear (fast mode) picks for qkv 4096x4096 at 90%,
and its time hot (graph replay) and cold (L2 flushed) beside cuBLAS.  python benchmarks/check_decode_dispatch.py"""
import sys, torch, torch.nn.functional as F
sys.path.insert(0, "benchmarks")
import spartune as st
from spartune import ops
from bench_csr import bench_cold
from triton.testing import do_bench_cudagraph
g = torch.Generator(device="cuda").manual_seed(0)
M = K = 4096
w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
w = w * (torch.rand(M, K, device="cuda", generator=g) < 0.1)
A = st.CSR.from_dense(w)
for N in (1, 16, 32):
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
    y = st.linear(x, A)
    torch.cuda.synchronize()
    state = ops._choices[A]
    picked = [v for k, v in state.items() if k != "meta"]
    ref = F.linear(x.float(), w.float())
    err = ((y.float() - ref).norm() / ref.norm()).item()
    h = do_bench_cudagraph(lambda: st.linear(x, A), rep=30, return_mode="median") * 1e3
    c = bench_cold(lambda: st.linear(x, A)) * 1e6
    dh = do_bench_cudagraph(lambda: F.linear(x, w), rep=30, return_mode="median") * 1e3
    dc = bench_cold(lambda: F.linear(x, w)) * 1e6
    print(f"N={N}: spartune.linear hot {h:.1f} cold {c:.1f} | cuBLAS hot {dh:.1f} cold {dc:.1f} | x cold {dc / c:.2f} | err {err:.1e}")
    print("   picked:", str(picked[-1])[:300])
