"""Probe (session 44): host time of a decode call, graph replay (SPARTUNE_GRAPHS=1) against a
direct launch (=0), csr and block:64, eager (ops.linear) and compiled SparseLinear; F.linear and
nn.Linear beside. Host time = wall time of calls queued behind a GPU sleep / calls."""
import os, time
import torch
import torch.nn.functional as F
from spartune import ops, dispatch
from spartune.nn import SparseLinear
from spartune.bench.weights import random_weight


def host_us(fn, calls=60, bound_us=300):
    fn(); torch.cuda.synchronize()
    s = []
    for _ in range(15):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * bound_us * 2e3))
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        s.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    s.sort()
    return s[len(s) // 2], s[0]


def report(name, fn):
    m, b = host_us(fn)
    print(f"{name:>52}: host us median / best {m:6.1f} / {b:6.1f}", flush=True)


gen = torch.Generator("cuda").manual_seed(0)
dev, dt = "cuda", torch.float16
for N in (1, 8):
    x = torch.randn(N, 4096, device=dev, dtype=dt)
    W = torch.randn(4096, 4096, device=dev, dtype=dt)
    report(f"F.linear 4096^2 N={N}", lambda: F.linear(x, W))
    for pattern, density in (("csr", 0.1), ("block:64", 0.1)):
        for graphs in ("1", "0"):
            os.environ["SPARTUNE_GRAPHS"] = graphs
            _, A = random_weight(pattern, 4096, 4096, density, dtype=dt, device=dev, gen=gen)
            y = ops.linear(x, A)
            ref = x.double() @ A.to_dense().double().T
            err = float((y.double() - ref).abs().max())
            ch = list(dispatch._states[A].chosen.values())[0]
            report(f"ops.linear {pattern} N={N} graphs={graphs} [{ch.backend} {getattr(ch.config, 'path', '')}] err {err:.3f}",
                   lambda: ops.linear(x, A))
os.environ["SPARTUNE_GRAPHS"] = "1"
lin = torch.nn.Linear(4096, 4096, bias=False, device=dev, dtype=dt)
x3 = torch.randn(1, 1, 4096, device=dev, dtype=dt)
with torch.no_grad():
    report("nn.Linear eager", lambda: lin(x3))
    cl = torch.compile(lin)
    report("nn.Linear compiled", lambda: cl(x3))
    for pattern, s in (("csr", 0.9), ("2:4", None)):
        slin = SparseLinear.from_linear(lin, pattern, s)
        slin(x3)
        report(f"SparseLinear {pattern} eager", lambda: slin(x3))
        cs = torch.compile(slin)
        report(f"SparseLinear {pattern} compiled", lambda: cs(x3))
