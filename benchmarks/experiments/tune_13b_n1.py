"""Probe (session 18): the tuner picked dense for 2:4 13B up at N = 1 once (its nm candidates timed
~450 us, 10x their do_bench time). Tune it again on a fresh DB, twice, and time the candidates directly."""
import os
import sqlite3
import sys

import torch

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

M, Kd = 13824, 5120
w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
A = sparsify_weight(w, "2:4")
x = torch.randn(int(sys.argv[1]) if len(sys.argv) > 1 else 1, Kd, device="cuda", dtype=torch.float16)
out = torch.empty(x.shape[0], M, device="cuda", dtype=torch.float16)
cfg = K.Config(32, 8, 4, 2, 4, stages=3)
K.launch(A, x, out, cfg)
print("direct cold replay", cold_replay(lambda: K.launch(A, x, out, cfg)) * 1e6)
st.linear(x, A)
print("picked", [f"{c.backend} {c.config}" for c in dispatch._states[A].chosen.values()])
print("tuned", cold_replay(lambda: st.linear(x, A)) * 1e6)
con = sqlite3.connect(os.path.join(os.environ["SPARTUNE_CACHE_DIR"], "tuning-v1.sqlite3"))
for row in con.execute("select backend, config, seconds, error from results"):
    print(row[0], str(row[1])[30:140], row[2], str(row[3])[:120])
