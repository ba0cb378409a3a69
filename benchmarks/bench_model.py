"""A Llama-7B MLP block (gate, up: 11008x4096; down: 4096x11008; down(silu(gate(x)) * up(x)))
dense against sparsified, the way a user runs it: eager, torch.compile (fullgraph) and CUDA
graphs (torch.compile mode="reduce-overhead", and the eager model captured by hand), fp16: GPU time with the L2 flushed before every
call, and host time per call.

    python benchmarks/bench_model.py [--patterns block:64,csr] [--sparsity 0.9] [--tokens 2048,8]

Prints a table (µs per block call, median) and writes JSON under $OUT (or ./out).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import spartune as st
from spartune.tune.measure import capture_stream


class LlamaMLP(nn.Module):
    def __init__(self, d=4096, hidden=11008):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


_flush = None


def gpu_us(fn, reps: int = 30) -> float:
    """Median GPU µs of fn() with the L2 flushed before each call (the other layers of a real
    model would have evicted this block's weights). A GPU sleep first lets the host queue every
    call, so the events time the GPU alone, never a GPU waiting for the host."""
    global _flush
    if _flush is None:
        _flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s: longer than the host takes to queue the reps
    for start, end in events:
        _flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


def host_us(fn, reps: int = 50) -> float:
    """Host µs per call of back-to-back calls: when above the GPU time, the rate a model runs at."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return host


def variants(model, x, eager_only=False):
    """{variant: callable} for one model and input."""
    out = {"eager": lambda: model(x)}
    if eager_only:
        return out
    compiled = torch.compile(model, fullgraph=True)
    graphed = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    out["compile"] = lambda: compiled(x)
    out["cudagraph"] = lambda: graphed(x)
    out["graph"] = captured(model, x)
    return out


def captured(model, x):
    """The eager model captured in one CUDA graph by hand (what serving engines do for decode):
    replay costs a few µs of host time."""
    side = capture_stream()  # (one per device: a new stream each time costs a cuBLAS workspace)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x)  # warm-up outside the capture (tuned already)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x)
    return graph.replay


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", default="block:64,csr")
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--tokens", default="2048,8")
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    dense = LlamaMLP().to("cuda", dtype).eval()
    models = {"dense": dense}
    for pattern in args.patterns.split(","):
        sparse = copy.deepcopy(dense)
        t = time.perf_counter()
        st.sparsify(sparse, pattern, args.sparsity)
        models[pattern] = sparse
        print(f"sparsify {pattern}: {time.perf_counter() - t:.1f} s", flush=True)
    rows = []
    with torch.no_grad():
        for n in map(int, args.tokens.split(",")):
            x = torch.randn(n, 4096, device="cuda", dtype=dtype)
            for name, model in models.items():
                torch._dynamo.reset()
                t = time.perf_counter()
                model(x)  # the first call tunes each layer (a tuning-DB hit later)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t
                for lname, m in model.named_children():
                    if isinstance(m, st.SparseLinear):
                        print(f"  {name} N={n} {lname}: {st.dispatch.find_choice(m.weight, n, args.dtype)}", flush=True)
                for variant, fn in variants(model, x).items():
                    gpu, host = gpu_us(fn), host_us(fn)
                    rows.append(dict(model=name, n=n, variant=variant, gpu_us=gpu, host_us=host, us=max(gpu, host),
                                     first_call_s=first_s))
                    print(rows[-1], flush=True)
    base = {(r["n"], r["variant"]): r["us"] for r in rows if r["model"] == "dense"}
    print("\nµs per call = max(GPU time with the L2 flushed, host time per call); (GPU / host)")
    print("| model | N | eager µs | compile µs | reduce-overhead µs | captured graph µs | x dense eager | x dense compile "
          "| x dense reduce-overhead | x dense captured |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in models:
        for n in map(int, args.tokens.split(",")):
            t = {r["variant"]: r["us"] for r in rows if r["model"] == name and r["n"] == n}
            ratios = " | ".join(f"{base[(n, v)] / t[v]:.2f}" for v in ("eager", "compile", "cudagraph", "graph"))
            gh = {r["variant"]: f"{r['us']:.1f} ({r['gpu_us']:.0f}/{r['host_us']:.0f})" for r in rows
                  if r["model"] == name and r["n"] == n}
            print(f"| {name} {args.sparsity if name != 'dense' else ''} | {n} | {gh['eager']} | {gh['compile']} | "
                  f"{gh['cudagraph']} | {gh['graph']} | {ratios} |")
    out = os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_model.json"), "w") as f:
        json.dump(dict(rows=rows, args=vars(args), device=torch.cuda.get_device_name()), f, indent=1)


if __name__ == "__main__":
    main()
