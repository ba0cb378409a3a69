"""Lean memory policy probe (session 31): what a per-call decompression costs, and what a CSR
90% / 64:2:8 layer holds and runs at under each policy. fp16, cold replays (L2 flushed).
Run: PYTHONPATH=$PWD python benchmarks/experiments/lean_probe.py  (writes $OUT/lean_probe.json)"""
import json
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.backends import transient_dense_linear
from spartune.kernels.densify import csr_to_dense
from spartune.nn import SparseLinear, resident_bytes
from spartune.tune.measure import cold_replay

SHAPES = {"qkv": (4096, 4096), "7b_up": (11008, 4096), "7b_down": (4096, 11008)}
dt = torch.float16
res = {"device": torch.cuda.get_device_name(), "decompress": {}, "layers": {}}
torch.manual_seed(0)
for name, (m, k) in (SHAPES if not os.environ.get("LAYERS_ONLY") else {}).items():
    w = torch.randn(m, k, device="cuda", dtype=dt)
    A = st.sparsify_weight(w, "csr", 0.9)
    assert torch.equal(csr_to_dense(A), A.to_dense())
    x = torch.randn(2048, k, device="cuda", dtype=dt)
    out = torch.empty(2048, m, device="cuda", dtype=dt)
    W = A.to_dense()
    us = {
        "torch_to_dense": cold_replay(lambda: A.to_dense()) * 1e6,
        "csr_to_dense": cold_replay(lambda: csr_to_dense(A)) * 1e6,
        "cublas_2048": cold_replay(lambda: F.linear(x, W)) * 1e6,
        "transient_dense_2048": cold_replay(lambda: transient_dense_linear(A, x, out)) * 1e6,
    }
    res["decompress"][name] = us
    print(name, {k2: round(v, 1) for k2, v in us.items()}, flush=True)
    del W

for pattern, sparsity in (("csr", 0.9), ("64:2:8", None), ("2:4", None)):
    for policy in ("speed", "lean"):
        st.set_memory_policy(policy)
        torch.manual_seed(1)
        lin = torch.nn.Linear(4096, 11008, bias=False, device="cuda", dtype=dt)
        dense_bytes = lin.weight.numel() * 2
        layer = SparseLinear.from_linear(lin, pattern, sparsity).cuda()
        row = {"format_mb": layer.weight.nbytes / 1e6}
        with torch.no_grad():
            for n in (1, 8, 2048):
                x = torch.randn(n, 4096, device="cuda", dtype=dt)
                y = layer(x)
                ref = x.double() @ layer.weight.to_dense().double().T
                err = ((y.double() - ref).norm() / ref.norm()).item()
                assert err < 2e-2, (pattern, policy, n, err)
                choice = dispatch.find_choice(layer.weight, n, "float16")
                row[f"n{n}"] = dict(us=cold_replay(lambda: layer(x)) * 1e6, pick=choice.backend if choice else None,
                                    dense_us=cold_replay(lambda: F.linear(x, lin.weight)) * 1e6)
        row["resident_mb"] = resident_bytes(layer) / 1e6

        def size(obj):
            if torch.is_tensor(obj):
                return obj.untyped_storage().nbytes() if obj.layout == torch.strided else 0
            if isinstance(obj, (tuple, list)):
                return sum(size(o) for o in obj)
            if isinstance(obj, dict):
                return sum(size(o) for o in obj.values())
            return sum(size(v) for v in vars(obj).values()) if type(obj).__module__.startswith("spartune") \
                and hasattr(obj, "__dict__") else 0

        row["memos_mb"] = {k2: size(v) / 1e6 for k2, v in vars(layer.weight).items() if size(v)}
        row["x_dense_memory"] = resident_bytes(layer) / dense_bytes
        res["layers"][f"{pattern}/{policy}"] = row
        print(pattern, policy, json.dumps(row), flush=True)
        del layer, lin
        torch.cuda.empty_cache()
st.set_memory_policy("speed")
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
with open(os.path.join(os.environ.get("OUT", "."), "lean_probe.json"), "w") as f:
    json.dump(res, f, indent=1)
print("\nlayer 11008x4096 | policy | resident MB (x dense) | N=1 us (pick) | N=8 | N=2048 | cuBLAS N=1/8/2048")
for key, r in res["layers"].items():
    print(key, f"{r['resident_mb']:.1f} ({r['x_dense_memory']:.2f})",
          *(f"{r[f'n{n}']['us']:.1f} ({r[f'n{n}']['pick']})" for n in (1, 8, 2048)),
          "/".join(f"{r[f'n{n}']['dense_us']:.1f}" for n in (1, 8, 2048)))
