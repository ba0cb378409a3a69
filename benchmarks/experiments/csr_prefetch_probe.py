"""csr_smem with its weight stream asked of the L2 first (PREFETCH_L2, session 34): the tuned pick
of each case compiled with 0 and several prefetch sizes, timed in turns by the write eviction
(as every figure) and by rotation over weight copies (evict_probe.py), cuBLAS beside it.
    PYTHONPATH=$PWD python benchmarks/experiments/csr_prefetch_probe.py
"""
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_csr_smem as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

sys.path.insert(0, os.path.dirname(__file__))
from evict_probe import copies, rotate_time  # noqa: E402

PREFETCH = (0, 4096, 16384, 65536)
SHAPES = {"qkv": (4096, 4096), "7B up": (11008, 4096), "7B down": (4096, 11008), "70B up": (28672, 8192)}


def case(name, N, density=0.1, dtype=torch.float16, rounds=3):
    M, Kd = SHAPES[name]
    torch.manual_seed(0)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    A0 = sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=dtype), "csr", 1 - density)
    st.linear(x, A0)
    (choice,) = dispatch._states[A0].chosen.values()
    row = dict(case=f"{name} N={N} {1 - density:.0%}", pick=f"{choice.backend} {choice.config}")
    ws = [torch.randn(M, Kd, device="cuda", dtype=dtype) for _ in range(copies(M * Kd * 2))]
    dense = [lambda w=w: F.linear(x, w) for w in ws]
    if choice.backend != "csr_smem":
        return row
    cfg = choice.config
    As = [A0] + [sparsify_weight(torch.randn(M, Kd, device="cuda", dtype=dtype), "csr", 1 - density)
                 for _ in range(copies(A0.nbytes) - 1)]
    expect = F.linear(x.double(), A0.to_dense().double())
    runs = {}
    for pref in PREFETCH:
        K.PREFETCH_L2 = pref
        outs = [torch.empty(N, M, device="cuda", dtype=dtype) for _ in As]
        bound = [K.bind(A, x, o, cfg) for A, o in zip(As, outs)]
        runs[pref] = [lambda b=b, o=o: b(x, o, None, None) for b, o in zip(bound, outs)]
        outs[0].fill_(float("nan"))
        runs[pref][0]()
        err = ((outs[0].double() - expect).norm() / expect.norm()).item()
        assert err < 1e-2, (pref, err)
    K.PREFETCH_L2 = 0
    times = {k: [] for k in ["dense"] + list(PREFETCH)}
    rot = {k: [] for k in times}
    for _ in range(rounds):
        for k in times:
            fns = dense if k == "dense" else runs[k]
            times[k].append(cold_replay(fns[0], 20))
            rot[k].append(rotate_time(fns))
    for k in times:
        row[f"{k}_write_us"] = statistics.median(times[k]) * 1e6
        row[f"{k}_rotate_us"] = statistics.median(rot[k]) * 1e6
    return row


if __name__ == "__main__":
    out = os.environ.get("OUT", ".")
    rows = []
    for name in SHAPES:
        for N in (8, 16):
            try:
                rows.append(case(name, N))
            except Exception as e:
                rows.append(dict(case=f"{name} N={N}", error=repr(e)))
            print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(out, "csr_prefetch_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'case':16s} {'way':6s} {'dense':>6s} " + " ".join(f"{p:>12d}" for p in PREFETCH) + "   (us, x dense)")
    for r in rows:
        if "dense_write_us" not in r:
            print(r)
            continue
        for way in ("write", "rotate"):
            d = r[f"dense_{way}_us"]
            print(f"{r['case']:16s} {way:6s} {d:6.1f} " + " ".join(
                f"{r[f'{p}_{way}_us']:6.1f} {d / r[f'{p}_{way}_us']:4.2f}" for p in PREFETCH))
