"""Probe: what the x^T copy costs a V:N:M decode call (70B up 64:2:8, N = 8): the same ring config
with x (N, K) (copied to x^T each call) against x = X.T of a contiguous (K, N) X (read in place),
graph-replayed with the L2 evicted; cuBLAS the same way."""
import torch
import torch.nn.functional as F

from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

torch.manual_seed(0)
for name, (M, Kd) in {"70b-up": (28672, 8192), "13b-up": (13824, 5120), "7b-up": (11008, 4096)}.items():
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "64:2:8")
    for n in (8, 16):
        x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
        X = x.t().contiguous()  # (K, N): X.T is x, read in place
        out = torch.empty(n, M, device="cuda", dtype=torch.float16)
        cfg = K.Config(64, 8, 4, 1, 4, stages=3)
        K.launch(A, x, out, cfg)
        ref = out.clone()
        K.launch(A, X.t(), out, cfg)
        assert torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2)
        copy = cold_replay(lambda: K.launch(A, x, out, cfg))
        inplace = cold_replay(lambda: K.launch(A, X.t(), out, cfg))
        dense = cold_replay(lambda: F.linear(x, w))
        print(f"{name} N={n}: with copy {copy * 1e6:.1f} us, in place {inplace * 1e6:.1f} us, copy costs "
              f"{(copy - inplace) * 1e6:.1f} us; cuBLAS {dense * 1e6:.1f} us: x{dense / copy:.2f} / x{dense / inplace:.2f}")
