"""Probe (session 30): PackedNM (a 2:4 weight in the tensor cores' order, no packed copy) against
NM: the Llama-7B layer's resident memory after prefill and decode, and cold call times in turns."""
import copy
import json
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune.bench.e2e import _llama
from spartune.nn import pack_weights, resident_bytes, sparsify
from spartune.tune.measure import cold_replay

from spartune import dispatch


def _bytes(obj, seen=None):
    seen = set() if seen is None else seen
    if torch.is_tensor(obj):
        if obj.layout != torch.strided:
            return 0
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, (tuple, list)):
        return sum(_bytes(o, seen) for o in obj)
    if isinstance(obj, dict):
        return sum(_bytes(o, seen) for o in obj.values())
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("spartune"):
        return _bytes(vars(obj), seen)
    return 0


torch.set_grad_enabled(False)
torch.manual_seed(0)
rows = []
calls = [_llama(2048, decode=False), _llama(1, decode=True), _llama(8, decode=True)]
built = [c(torch.float16, "cuda", False) for c in calls]
model = built[0][0]
dense = resident_bytes(model)
for pattern, packed in (("2:4", True), ("64:2:8", False), ("64:2:8", True)):
    m = copy.deepcopy(model)
    sparsify(m, pattern)
    if not packed:  # sparsify packs: the canonical formats for the comparison
        for mod in m.modules():
            if isinstance(mod, st.nn.SparseLinear) and hasattr(mod.weight, "unpack"):
                mod._adopt(mod.weight.unpack(), False)
    after = {}
    for (_, call), name in zip(built, ("prefill 2048", "decode 1", "decode 8")):
        call(m)()
        torch.cuda.synchronize()
        after[name] = round(resident_bytes(m) / 1e6, 1)
    held = {}
    for mname, mod in m.named_modules():
        if isinstance(mod, st.nn.SparseLinear):
            A = mod.weight
            for key, val in A.__dict__.items():
                if key.startswith("_") and key not in ("_spec", "_stats"):
                    held[f"{mname}.{key}"] = round(resident_bytes(torch.nn.Module()) + _bytes(val) / 1e6, 1)
            for n in (2048, 1, 8):
                c = dispatch.find_choice(A, n, "float16")
                held[f"{mname}.pick{n}"] = None if c is None else f"{c.backend}"
    print(json.dumps(held), flush=True)
    row = dict(kind="memory", pattern=pattern, packed=packed, dense_mb=round(dense / 1e6, 1), resident_mb=after,
               x_dense=round(after["decode 8"] * 1e6 / dense, 3))
    print(json.dumps(row), flush=True)
    rows.append(row)
    del m
del model, built
torch.cuda.empty_cache()
for name, M, K in () if os.environ.get("NO_TIME") else (("7b-up", 11008, 4096), ("7b-down", 4096, 11008)):
    w = torch.randn(M, K, device="cuda", dtype=torch.float16)
    A = st.sparsify_weight(w, os.environ.get("PATTERN", "2:4"))
    P = st.nn.linear.packed_layout(A)
    wd = A.to_dense()
    for N in (1, 16, 2048):
        x = torch.randn(N, K, device="cuda", dtype=torch.float16)
        ref = x.double() @ wd.double().T
        ya, yp = st.linear(x, A), st.linear(x, P)
        err = ((yp.double() - ref).norm() / ref.norm()).item()
        same = torch.equal(ya, yp)
        t = {"nm": [], "packed": [], "dense": []}
        for _ in range(3):
            t["nm"].append(cold_replay(lambda: st.linear(x, A)))
            t["packed"].append(cold_replay(lambda: st.linear(x, P)))
            t["dense"].append(cold_replay(lambda: F.linear(x, wd)))
        med = {k: sorted(v)[1] * 1e6 for k, v in t.items()}
        row = dict(kind="time", pattern=A.signature, shape=name, N=N, us=med, x_dense_nm=med["dense"] / med["nm"],
                   x_dense_packed=med["dense"] / med["packed"], err=err, bitwise_same=same)
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "packed_probe.json"), "w"), indent=1)
