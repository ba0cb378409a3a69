"""Host cost of a tuned spartune.linear call (GPU): what the Python path adds above the chosen
kernel's own launch, in fp16 and bf16, and what the first call on a new weight costs when its
problem is already tuned (a hit in the tuner's memory, and a hit in the tuning DB as a new
process sees it).

    python benchmarks/bench_host.py [--calls 400] [--rounds 5] [--json PATH]

Host time per call = wall time of `calls` back-to-back calls queued behind a GPU sleep (so the
loop measures the host whatever the kernels' own time: prefill calls too) / calls. The raw launch
calls the chosen backend's launch with the chosen config directly (a CUDA family's unbound
launch: its checks and set-up on every call, which a tuned call binds once).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import spartune as st
from spartune import ops
from spartune.dispatch import find_choice
from spartune.bench.weights import random_weight

CASES = (  # (pattern, M, K, N, density)
    ("block:64", 4096, 4096, 16, 0.1),
    ("csr", 4096, 4096, 1, 0.1),
    ("csr", 5120, 5120, 1, 0.1),
    ("csr", 11008, 4096, 8, 0.1),
    ("shfl:64", 4096, 4096, 16, 0.1),
    ("2:4", 4096, 4096, 16, 0.5),
    ("2:4", 11008, 4096, 1, 0.5),
    ("64:2:8", 11008, 4096, 1, 0.25),
    ("2:4", 11008, 4096, 2048, 0.5),
)
HOST_US_BOUND = 250  # the most host time a call is expected to take: the GPU sleeps through the loop


def raw_launcher(A, choice, x, out):
    """The chosen backend's own launch, bound to (x, out): what a hand-written call would do."""
    from spartune import backends
    from spartune.kernels import registry

    family = registry.by_name(choice.backend)
    if family is not None:
        return lambda: family.launch(A, x, out, choice.config)
    fn = backends.library_backends(A)[choice.backend]
    return lambda: fn(A, x, out)


def host_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(int(calls * HOST_US_BOUND * 2e3))  # ~2000 cycles a us: every call below only queues
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t
    torch.cuda.synchronize()
    return t / calls * 1e6


def first_call_ms(x, A) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    st.linear(x, A)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def case(pattern, M, K, N, density, dtype, calls, rounds, gen) -> dict:
    w, A = random_weight(pattern, M, K, density, dtype=dtype, device="cuda", gen=gen)
    x = torch.randn(N, K, device="cuda", generator=gen).to(dtype)
    st.linear(x, A)  # tunes (or hits the DB of an earlier run)
    choice = find_choice(A, N, str(dtype).removeprefix("torch."))
    out = torch.empty(N, M, device="cuda", dtype=dtype)
    raw = raw_launcher(A, choice, x, out)
    op = lambda: st.linear(x, A)  # noqa: E731
    dense = lambda: torch.nn.functional.linear(x, w)  # noqa: E731
    layer = st.SparseLinear(A)
    module = lambda: layer(x)  # noqa: E731  (what a sparsified model calls)
    for fn in (op, raw, dense, module):
        host_us(fn, calls // 4)  # warm
    t_op, t_raw, t_dense, t_module = [], [], [], []
    for _ in range(rounds):
        t_op.append(host_us(op, calls))
        t_raw.append(host_us(raw, calls))
        t_dense.append(host_us(dense, calls))
        t_module.append(host_us(module, calls))
    # first call on a new weight object of a tuned problem: the tuner's memory, then the DB
    memo_hit = first_call_ms(x, A.with_values(A.values.clone()))
    ops.set_mode(ops.get_tuner().mode)  # a fresh tuner: what a new process sees
    db_hit = first_call_ms(x, A.with_values(A.values.clone()))
    return {"pattern": pattern, "M": M, "K": K, "N": N, "density": density, "dtype": str(dtype).removeprefix("torch."),
            "picked": f"{choice.backend} {choice.config}" if choice else "?",
            "linear_us": statistics.median(t_op), "raw_launch_us": statistics.median(t_raw),
            "overhead_us": statistics.median(a - b for a, b in zip(t_op, t_raw)),
            "flinear_us": statistics.median(t_dense), "module_us": statistics.median(t_module),
            "linear_best_us": min(t_op), "flinear_best_us": min(t_dense),
            "memo_hit_first_call_ms": memo_hit,
            "db_hit_first_call_ms": db_hit}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    args = p.parse_args()
    torch.set_grad_enabled(False)  # inference: the eager route (autograd would take the operator)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for dtype in (getattr(torch, d) for d in args.dtypes):
        for c in CASES:
            try:
                rows.append(case(*c, dtype, args.calls, args.rounds, gen))
            except Exception as e:  # noqa: BLE001  (a case that fails is reported, the rest run)
                rows.append({"pattern": c[0], "M": c[1], "K": c[2], "N": c[3], "dtype": str(dtype), "error": repr(e)[:200]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'pattern':<9} {'M x K':>11} {'N':>4} {'dtype':<9} {'linear':>7} {'raw':>6} {'over':>6} {'module':>6} {'F.lin':>6} {'best':>11} "
          f"{'memo ms':>8} {'db ms':>7}  picked")
    for r in rows:
        head = f"{r['pattern']:<9} {r['M']:>5}x{r['K']:<5} {r['N']:>4} {r['dtype']:<9}"
        if "error" in r:
            print(f"{head} ERROR {r['error']}")
            continue
        print(f"{head} {r['linear_us']:7.1f} {r['raw_launch_us']:6.1f} {r['overhead_us']:6.1f} {r['module_us']:6.1f} "
              f"{r['flinear_us']:6.1f} {r['linear_best_us']:5.1f}/{r['flinear_best_us']:<5.1f} "
              f"{r['memo_hit_first_call_ms']:8.2f} {r['db_hit_first_call_ms']:7.2f}  {r['picked'][:60]}")
    print("host us per call: linear, raw launch of the chosen kernel, overhead = linear - raw, SparseLinear "
          "module, F.linear dense (medians of the rounds); best: linear / F.linear, the least of the rounds")


if __name__ == "__main__":
    main()
