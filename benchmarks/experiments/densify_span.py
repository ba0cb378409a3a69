"""densify: one program a row (span past K) against rows cut in spans, cold, 90% fp16."""
import json, os
import torch
import spartune as st
from spartune.kernels.densify import csr_to_dense
from spartune.tune.measure import cold_replay
OUT = os.environ.get("OUT", "out")
gen = torch.Generator(device="cuda").manual_seed(0)
res = []
for name, M, K in [("qkv", 4096, 4096), ("7b-up", 11008, 4096), ("7b-down", 4096, 11008), ("70b-up", 28672, 8192)]:
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
    w = w * (torch.rand(M, K, device="cuda", generator=gen) < 0.1)
    A = st.CSR.from_dense(w)
    row = dict(shape=name, torch=cold_replay(lambda: A.to_dense()) * 1e6)
    for span in (1 << 20, 4096, 2048):
        assert torch.equal(csr_to_dense(A, span=span), w)
        row[span] = cold_replay(lambda: csr_to_dense(A, span=span)) * 1e6
    res.append(row)
    print(f"{name:8} torch {row['torch']:6.1f}  one a row {row[1 << 20]:6.1f}  span 4096 {row[4096]:6.1f}  span 2048 {row[2048]:6.1f} us"
          f"  ({2 * M * K / row[4096] / 1e6:.2f} TB/s written at 4096)", flush=True)
json.dump(res, open(os.path.join(OUT, "densify_span.json"), "w"), indent=1)
