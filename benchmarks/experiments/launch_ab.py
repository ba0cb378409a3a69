"""A/B of the host time of one blocked / CSR launch: Triton's own launch against kernels/_launch.py's
direct call, in one process; then a cProfile of SparseLinear calls."""
import cProfile
import pstats
import time

import torch

import spartune as st
from spartune.kernels import spmm_blocked
from spartune.kernels.spmm_csr import row


def host_us(fn, calls=2000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return dt


torch.set_grad_enabled(False)
for pattern, n in (("block:64", 16), ("csr", 1)):
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    layer = st.SparseLinear(st.sparsify_weight(w, pattern, 0.9)).cuda()
    x = torch.randn(n, 4096, device="cuda", dtype=torch.float16)
    layer(x)
    fast = {"blocked": (spmm_blocked, "_FAST"), "csr": (row, "_FAST_ROW")}
    mod, name = fast["blocked" if pattern.startswith("block") else "csr"]
    t_fast = host_us(lambda: layer(x))
    saved = getattr(mod, name)
    setattr(mod, name, saved.fn)  # Triton's own launch
    if mod is row:
        row._FAST_ROWT = row._FAST_ROWT.fn
    t_triton = host_us(lambda: layer(x))
    setattr(mod, name, saved)
    t_dense = host_us(lambda: torch.nn.functional.linear(x, w))
    print(f"{pattern} N={n}: SparseLinear with direct launch {t_fast:.1f} us, with Triton's launch {t_triton:.1f} us, "
          f"F.linear {t_dense:.1f} us", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        layer(x)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
