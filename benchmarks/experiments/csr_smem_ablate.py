"""Probe (issue 16, csr_smem v5): where a CTA's time goes. Cold times of one config with parts
of the kernel cut out at compile time (ABLATE: 1 no x staging, 2 no weight stream, 3 neither),
without L2 prefetch (PD = 2) and with the generic staging instead of the paired one."""
import torch

import spartune as st
from spartune.kernels import cuda
from spartune.kernels import spmm_csr_smem as K
from spartune.tune.measure import cold_replay

CASES = [(4096, 4096, 8, K.Config(8, 4096, 16, 1, 1, 16)), (11008, 4096, 8, K.Config(8, 4096, 32, 1, 1, 8)),
         (4096, 4096, 16, K.Config(16, 4096, 16, 1, 1, 8))]
extra = {}


def kernel(config, dtype, device):
    defines = {"SPARTUNE_BF16": 0, "NT": config.nt, "WARPS": config.warps, "KS": config.ks, "GPW": config.gpw,
               "QS": config.qs, "KW": config.kw, **extra}
    return cuda.load(cuda.instance("spmm_csr_smem.cu", "spmm_csr_smem", defines), device)


K._kernel = kernel
pairs = K._pairs_of_x
gen = torch.Generator(device="cuda").manual_seed(0)
for M, Kd, N, cfg in CASES:
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, Kd, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    x = torch.randn(N, Kd, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    line = []
    for name, ex, pr in [("full", {}, pairs), ("no-x", {"ABLATE": 1}, pairs), ("no-w", {"ABLATE": 2}, pairs),
                         ("neither", {"ABLATE": 3}, pairs)]:
        extra.clear()
        extra.update(ex)
        K._pairs_of_x = pr
        fn = lambda: K.launch(A, x, out, cfg)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        line.append(f"{name} {cold_replay(fn) * 1e6:.1f}")
    print(f"{M}x{Kd} N={N} {cfg}: " + ", ".join(line), flush=True)
