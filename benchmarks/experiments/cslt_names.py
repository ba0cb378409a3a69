"""Probe: the kernel names cuSPARSELt's best algorithm runs (tile, cluster, schedule), 2:4 prefill."""
import torch
from torch.profiler import ProfilerActivity, profile

from spartune.backends import cusparselt
from spartune.kernels import spmm_nm as SK
from spartune.prune import sparsify_weight

for M, K, N in ((11008, 4096, 2048), (4096, 11008, 2048), (13824, 5120, 2048), (13824, 5120, 8192)):
    torch.manual_seed(0)
    A = sparsify_weight(torch.randn(M, K, device="cuda", dtype=torch.float16), "2:4")
    x = torch.randn(N, K, device="cuda", dtype=torch.float16)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    ours = [lambda A, x, out, transposed_ok, c=c: SK.launch(A, x, out, c) for c in (
        SK.Config(128, 256, 12, variant="wgmma", stages=4, group_m=16), SK.Config(256, 128, 12, variant="wgmma", stages=5, group_m=8))]
    for fn in (cusparselt.cusparselt_linear, cusparselt.cusparselt_search_linear, *ours):
        try:
            fn(A, x, out, transposed_ok=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fn(A, x, out, transposed_ok=True)
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.device_type.name == "CUDA":
                    print(M, K, N, fn.__name__, f"{e.device_time:.1f}us x{e.count}", e.key[:160])
        except Exception as err:  # noqa: BLE001
            print(M, K, N, fn.__name__, "failed:", repr(err)[:200])
