"""Lead 3 of session 41: the tuned call's dense pick read 0.95x of F.linear under rotation at 70B
N = 32 (one rotated timing each, one after the other). Timed here in turns, 5 rounds, both ways
(cold_replay and rotated_replay), with the dense path's own call (backends.dense.dense_linear) as
a third: if the pick's path costs nothing, all three agree within the board's noise."""
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune.backends.dense import dense_linear
from spartune.dispatch import find_choice
from spartune.tune.measure import cold_replay, rotated_replay

M, K, N, density = 28672, 8192, 32, 0.1
gen = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen)
w = w * (torch.rand(M, K, device="cuda", generator=gen) < density)
A = st.CSR.from_dense(w)
x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
st.linear(x, A)
print("pick:", find_choice(A, N, "float16"), flush=True)
out = torch.empty(N, M, device="cuda", dtype=torch.float16)
cases = {
    "F.linear": (lambda v: F.linear(x, v), w, w.numel() * 2),
    "tuned": (lambda B: st.linear(x, B), A, A.nbytes),
    "dense_linear": (lambda B: dense_linear(B, x, out), A, A.nbytes),
}
rows = {f"{k} {how}": [] for k in cases for how in ("cold", "rotated")}
for r in range(5):
    for name, (call, operand, nbytes) in (cases.items() if r % 2 == 0 else reversed(cases.items())):
        rows[f"{name} cold"].append(cold_replay(lambda: call(operand)) * 1e6)
        rows[f"{name} rotated"].append(rotated_replay(call, operand, nbytes, rounds=3) * 1e6)
        torch.cuda.empty_cache()
result = {k: dict(median=statistics.median(v), all=v) for k, v in rows.items()}
for k, v in result.items():
    print(f"{k:24s} {v['median']:8.1f} us   {' '.join(f'{t:.1f}' for t in v['all'])}")
out_dir = os.environ.get("OUT")
if out_dir:
    json.dump(result, open(os.path.join(out_dir, "dense_pick_rotate.json"), "w"), indent=1)
