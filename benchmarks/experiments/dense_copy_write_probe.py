"""70B up 70% N = 32: the tuned dense pick timed 133 us write-evicted against F.linear's 120
(and 114 / 115 rotated). Is it the weight's allocation (dense_weight(A), made after the CSR
copy) or the dispatch? In turns, write-evicted: F.linear on w, on a clone of w, on A's dense
copy, and st.linear; each also by cold_replay."""
import json
import os

import torch
import torch.nn.functional as F

import spartune as st
from spartune.backends.dense import dense_weight
from spartune.tune.measure import cold_replay, interleaved

rows = {}
for density in (0.3, 0.1):
    g = torch.Generator("cuda").manual_seed(0)
    w = torch.randn(28672, 8192, device="cuda", dtype=torch.float16, generator=g)
    w = w * (torch.rand(28672, 8192, device="cuda", generator=g) < density)
    A = st.CSR.from_dense(w)
    x = torch.randn(32, 8192, device="cuda", dtype=torch.float16, generator=g)
    st.linear(x, A)  # tunes
    wc, wd = w.clone(), dense_weight(A)
    fns = {"F.linear(w)": lambda: F.linear(x, w), "F.linear(clone)": lambda: F.linear(x, wc),
           "F.linear(dense_weight(A))": lambda: F.linear(x, wd), "st.linear": lambda: st.linear(x, A)}
    turns = interleaved(fns, rounds=15)
    cold = {k: cold_replay(f) for k, f in fns.items()}
    rows[density] = dict(turns=turns, cold=cold, ptrs={k: hex(t.data_ptr()) for k, t in
                                                       (("w", w), ("clone", wc), ("dense_weight", wd))})
    print(density, json.dumps({k: round(v * 1e6, 1) for k, v in turns.items() if not k.startswith("ratio")}),
          json.dumps({k: round(v * 1e6, 1) for k, v in cold.items()}), rows[density]["ptrs"], flush=True)
    del w, A, x, wc, wd, fns
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "dense_copy_write_probe.json"), "w"), indent=1)
