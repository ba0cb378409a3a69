"""csr_to_dense's block sizes and warps on the Llama shapes (CSR 90%, fp16, cold). Session 31."""
import itertools
import json
import os

import torch

import spartune as st
from spartune.kernels.densify import csr_to_dense
from spartune.tune.measure import cold_replay

out = {}
for name, (m, k) in {"qkv": (4096, 4096), "7b_up": (11008, 4096), "7b_down": (4096, 11008)}.items():
    A = st.sparsify_weight(torch.randn(m, k, device="cuda", dtype=torch.float16), "csr", 0.9)
    want = A.to_dense()
    for bk, bnz, nw in itertools.product((1024, 2048, 4096), (256, 1024), (4, 8)):
        assert torch.equal(csr_to_dense(A, bk, bnz, nw), want)
        out[f"{name} bk{bk} nz{bnz} w{nw}"] = cold_replay(lambda: csr_to_dense(A, bk, bnz, nw)) * 1e6
    best = sorted((v, kk) for kk, v in out.items() if kk.startswith(name + " "))[:3]
    print(name, f"default {out[f'{name} bk1024 nz256 w4']:.1f} us; best", [(kk, round(v, 1)) for v, kk in best], flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "densify_probe.json"), "w"), indent=1)
