"""Probe (session 29): what a sparsified Llama-7B layer holds on the GPU after it has run prefill
(N = 2048) and decode (N = 1, 8) eagerly, beside the dense layer: the one packing (this tree) or
the mma and wgmma packings apart (the previous one)."""
import copy
import json
import sys

import torch

from spartune.bench.e2e import _llama
from spartune.nn import resident_bytes, sparsify

torch.set_grad_enabled(False)
torch.manual_seed(0)
calls = [_llama(2048, decode=False), _llama(1, decode=True), _llama(8, decode=True)]
built = [c(torch.float16, "cuda", False) for c in calls]
model = built[0][0]
dense = resident_bytes(model)
for pattern in ("2:4", "64:2:8"):
    m = copy.deepcopy(model)
    sparsify(m, pattern)
    after = {}
    for (_, call), name in zip(built, ("prefill 2048", "decode 1", "decode 8")):
        call(m)()
        torch.cuda.synchronize()
        after[name] = round(resident_bytes(m) / 1e6, 1)
    print(json.dumps(dict(tree=sys.argv[1], pattern=pattern, dense_mb=round(dense / 1e6, 1), resident_mb=after,
                          x_dense=round(after["decode 8"] * 1e6 / dense, 3))), flush=True)
    del m
