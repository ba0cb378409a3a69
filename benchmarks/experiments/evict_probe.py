"""How the L2 eviction shapes decode times and ratios (session 17's lead: "measure both ways").

Each call timed three ways, its dense cuBLAS call beside it the same way:
  write   measure.cold_replay as tuner and benches use it: a zero_ of 2x L2, minus the write alone
          (the write leaves ~50 MB of dirty lines whose write-back the call's reads meet)
  read    the same with a sum over a clean 2x L2 buffer as the eviction, minus the sum alone
  rotate  R distinct copies of the weight, called in turn from one graph, nothing else
          (METHOD.md's rotation of input sets; what a model's layers do to each other)
    PYTHONPATH=$PWD python benchmarks/experiments/evict_probe.py
"""
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F

import spartune as st
from spartune.prune import sparsify_weight
from spartune.tune.measure import capture_stream, cold_replay

L2 = torch.cuda.get_device_properties(0).L2_cache_size
CLEAN = torch.ones(2 * L2 // 4, dtype=torch.int32, device="cuda")


def read_evict():
    CLEAN.sum()


def rotate_time(fns, reps=4, rounds=7) -> float:
    """Seconds per call of fns called in turn from one graph (each its own operands)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                for f in fns:
                    f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    ts = []
    for _ in range(rounds):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e-3 / (reps * len(fns)))
    graph.reset()
    return statistics.median(ts)


def copies(nbytes):
    return max(2, min(24, math.ceil(2.5 * L2 / nbytes)))


def three_ways(fns):
    f = fns[0]
    return dict(write=cold_replay(f, 20), read=cold_replay(f, 20, evict=read_evict), rotate=rotate_time(fns))


def case(name, M, K, N, pattern, sparsity=None, dtype=torch.float16):
    torch.manual_seed(0)
    x = torch.randn(N, K, device="cuda", dtype=dtype)
    ws = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(copies(M * K * 2))]
    dense = [lambda w=w: F.linear(x, w) for w in ws]
    sp_w = torch.randn(M, K, device="cuda", dtype=dtype)
    A0 = sparsify_weight(sp_w, pattern, sparsity)
    nbytes = A0.nbytes
    As = [A0] + [sparsify_weight(torch.randn_like(sp_w), pattern, sparsity) for _ in range(copies(nbytes) - 1)]
    ours = [lambda A=A: st.linear(x, A) for A in As]
    for f in ours:  # tunes once, prepares every copy's kernel layout
        f()
    expect = F.linear(x.double(), A0.to_dense().double())
    err = ((ours[0]().double() - expect).norm() / expect.norm()).item()
    assert err < 1e-2, err
    d, o = three_ways(dense), three_ways(ours)
    row = dict(case=name, M=M, K=K, N=N, pattern=pattern, sparse_mb=nbytes / 1e6, copies=(len(ws), len(As)))
    for way in d:
        row[f"dense_{way}_us"] = d[way] * 1e6
        row[f"ours_{way}_us"] = o[way] * 1e6
        row[f"ratio_{way}"] = d[way] / o[way]
    return row


def plain_read(mb):
    bufs = [torch.ones(int(mb * 1e6) // 2, dtype=torch.float16, device="cuda") for _ in range(copies(mb * 1e6))]
    t = three_ways([lambda b=b: b.sum() for b in bufs])
    return dict(case=f"plain sum {mb} MB", **{f"{k}_us": v * 1e6 for k, v in t.items()},
                **{f"{k}_TBps": mb * 1e6 / v / 1e12 for k, v in t.items()})


CASES = [
    ("7B down 2:4 N=1", 4096, 11008, 1, "2:4"), ("7B down 2:4 N=16", 4096, 11008, 16, "2:4"),
    ("7B up 2:4 N=16", 11008, 4096, 16, "2:4"), ("13B up 2:4 N=16", 13824, 5120, 16, "2:4"),
    ("7B up 64:2:8 N=1", 11008, 4096, 1, "64:2:8"), ("7B down 64:2:8 N=1", 4096, 11008, 1, "64:2:8"),
    ("7B down csr90 N=8", 4096, 11008, 8, "csr", 0.9), ("qkv csr90 N=8", 4096, 4096, 8, "csr", 0.9),
    ("7B up csr90 N=16", 11008, 4096, 16, "csr", 0.9),
]

if __name__ == "__main__":
    out = os.environ.get("OUT", ".")
    rows = [plain_read(mb) for mb in (6.7, 51, 90)]
    for r in rows:
        print(json.dumps(r), flush=True)
    for c in CASES:
        try:
            rows.append(case(*c))
        except Exception as e:  # one case's failure keeps the others
            rows.append(dict(case=c[0], error=repr(e)))
        print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(out, "evict_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'case':22s} {'write':>16s} {'read':>16s} {'rotate':>16s}   (dense/ours us, x)")
    for r in rows:
        if "ratio_write" in r:
            print(f"{r['case']:22s} " + " ".join(
                f"{r[f'dense_{w}_us']:5.1f}/{r[f'ours_{w}_us']:5.1f} {r[f'ratio_{w}']:4.2f}" for w in ("write", "read", "rotate")))
        elif "write_us" in r:
            print(f"{r['case']:22s} " + " ".join(f"{r[f'{w}_us']:6.1f} {r[f'{w}_TBps']:4.2f}TB/s" for w in ("write", "read", "rotate")))
        else:
            print(r)
