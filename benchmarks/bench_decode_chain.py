"""Decode layers back to back, as inside a model: a chain of Llama-7B up / down layers (each
layer's output the next one's x) through the tuned `spartune.linear`, captured in one CUDA graph
and replayed after a write past the L2 (measure.cold_replay), beside the same chain on cuBLAS.
Each sparse chain runs twice, over identical weights: with its calls launched plainly
(SPARTUNE_OVERLAP=0 when they were bound) and overlapped (programmatic dependent launch: a
layer's CTAs start, and its weight streams, while the layer before finishes). A single call's
benchmark (bench_nm_decode.py) cannot show the overlap: it has no layer before. `--between silu`
puts a torch kernel between the layers, as a model does (it lets the next layer start only when
it ends).

    python benchmarks/bench_decode_chain.py [--patterns 2:4 64:2:8] [--n 1 16] [--layers 8]
        [--dtype bfloat16] [--between none silu] [--out DIR]

Every chain's output is checked against float64. Prints a table last and writes JSON to DIR
(default $OUT or ./out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

import spartune as st
from spartune.prune import sparsify_weight
from spartune.prune.patterns import parse_pattern
from spartune.tune.measure import cold_replay

UP, DOWN = (11008, 4096), (4096, 11008)


def layer_weights(layers: int, dtype, seed: int, density: float = 1.0) -> list[torch.Tensor]:
    """Up, down, up, ...: scaled so that x keeps its size through the chain once pruned to `density`."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [UP if i % 2 == 0 else DOWN for i in range(layers)]
    return [torch.randn(M, K, device="cuda", dtype=dtype, generator=g) / (K * density) ** 0.5 for M, K in shapes]


def bound_chain(weights, x, overlap: bool, between):
    """The chain over `weights` (formats), each layer bound (tuned, first call) with overlap on or off."""
    os.environ["SPARTUNE_OVERLAP"] = "1" if overlap else "0"
    try:
        chain = lambda: _run(weights, x, st.linear, between)  # noqa: E731
        chain()
        torch.cuda.synchronize()
    finally:
        os.environ.pop("SPARTUNE_OVERLAP", None)
    return chain


def _run(weights, x, linear, between):
    h = x
    for i, A in enumerate(weights):
        h = linear(h, A)
        if between is not None and i + 1 < len(weights):
            h = between(h)
    return h


BETWEEN = {"none": None, "silu": F.silu}  # silu: a torch kernel between layers, as in a model


def relative_error(out, ref) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def run_case(pattern: str, n: int, layers: int, dtype, rounds: int, between: str) -> dict:
    dense = layer_weights(layers, dtype, seed=n)
    scaled = layer_weights(layers, dtype, seed=n, density=parse_pattern(pattern).fixed_density)
    sparse = [sparsify_weight(w, pattern) for w in scaled]
    twins = [sparsify_weight(w, pattern) for w in scaled]  # identical weights, their own dispatch state
    x = torch.randn(n, UP[1], device="cuda", dtype=dtype)
    act = BETWEEN[between]
    ref = _run([A.to_dense().double() for A in sparse], x.double(), F.linear, act)
    chains = {"cublas": lambda: _run(dense, x, F.linear, act), "plain": bound_chain(twins, x, False, act),
              "overlap": bound_chain(sparse, x, True, act)}
    errors = {name: relative_error(chain(), ref) for name, chain in chains.items() if name != "cublas"}
    if not max(errors.values()) < 1e-2:
        raise AssertionError(f"{pattern} N={n}: relative errors {errors}")
    times = {name: [] for name in chains}
    for _ in range(rounds):
        for name, chain in chains.items():
            times[name].append(cold_replay(chain) * 1e6 / layers)
    us = {name: statistics.median(t) for name, t in times.items()}
    return dict(pattern=pattern, n=n, between=between, layers=layers, dtype=str(dtype).split(".")[1],
                us_per_layer=us, errors=errors,
                x_dense={name: us["cublas"] / us[name] for name in ("plain", "overlap")},
                overlap_gain_us=us["plain"] - us["overlap"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--patterns", nargs="+", default=["2:4", "64:2:8"])
    p.add_argument("--n", nargs="+", type=int, default=[1, 16])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--between", nargs="+", default=["none", "silu"], choices=list(BETWEEN))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for pattern in args.patterns:
        for n in args.n:
            for between in args.between:
                row = run_case(pattern, n, args.layers, dtype, args.rounds, between)
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = args.out or os.environ.get("OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"bench_decode_chain_{args.dtype}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{args.layers} layers, Llama-7B up/down alternating, {args.dtype}, us a layer (cold graph replay)")
    print(f"{'pattern':8} {'N':>3} {'between':8} {'cuBLAS':>8} {'plain':>8} {'overlap':>8} {'gain':>6} {'x dense':>8}")
    for r in rows:
        us = r["us_per_layer"]
        print(f"{r['pattern']:8} {r['n']:>3} {r['between']:8} {us['cublas']:8.2f} {us['plain']:8.2f} "
              f"{us['overlap']:8.2f} {r['overlap_gain_us']:6.2f} {r['x_dense']['overlap']:8.2f}")


if __name__ == "__main__":
    main()
