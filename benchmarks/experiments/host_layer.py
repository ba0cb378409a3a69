"""Probe (session 44): where the host time of an eager / compiled sparse Llama-7B decode layer goes.
Host time = wall time of calls queued behind a GPU sleep / calls."""
import cProfile, copy, io, pstats, sys, time, os
import torch
import torch.nn.functional as F
import spartune as st
from spartune.bench import e2e
from spartune.nn import sparsify

torch.manual_seed(0)
OUT = os.environ.get("OUT", "/tmp")


def host_us(fn, calls=10, bound_us=1500):
    """calls small enough that the launch queue (~1000 entries) never fills behind the sleep"""
    fn(); torch.cuda.synchronize()
    best = []
    for _ in range(15):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * bound_us * 2e3))
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    best.sort()
    return best[len(best) // 2], best[0]


def profile(fn, name, calls=10, top=35, batches=20):
    if os.environ.get("PROFILE", "1") == "0":
        return
    fn(); torch.cuda.synchronize()
    pr = cProfile.Profile()
    for _ in range(batches):
        torch.cuda._sleep(int(calls * 3000 * 2e3))
        pr.enable()
        for _ in range(calls):
            fn()
        pr.disable(); torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    txt = s.getvalue()
    open(f"{OUT}/profile_{name}.txt", "w").write(txt)
    print(f"==== {name}: top by tottime (per {calls} calls)")
    print("\n".join(txt.splitlines()[:top + 12]))


with torch.no_grad():
    w = [x for x in e2e.WORKLOADS if x.name == "llama7b-layer decode N=1"][0]
    dense, call = w.build(torch.float16, "cuda", False)
    models = {"dense": dense}
    for pat, s in (("csr", 0.9), ("2:4", 0.5))[:int(os.environ.get("PATTERNS", "2"))]:
        m = copy.deepcopy(dense)
        sparsify(m, pat, s)
        models[pat] = m
    fns = {k: call(m) for k, m in models.items()}
    for k, f in fns.items():
        f(); torch.cuda.synchronize()
    res = {}
    for k, f in fns.items():
        res[k] = host_us(f)
        print(f"eager layer {k}: host us median/best {res[k][0]:.1f} / {res[k][1]:.1f}", flush=True)
    from spartune import dispatch
    for k in ("csr", "2:4"):
        for n_, mod in models[k].named_modules():
            if hasattr(mod, "_weight"):
                stt = dispatch._states.get(mod._weight)
                print(k, n_, None if stt is None else {kk[0]: v for kk, v in stt.chosen.items()})
    # one linear
    x = torch.randn(1, 1, 4096, device="cuda", dtype=torch.float16)
    lin_d, lin_s = models["dense"].q_proj, models["csr"].q_proj
    A = lin_s._weight
    for name, f in () if os.environ.get("SINGLE", "1") == "0" else (("nn.Linear q", lambda: lin_d(x)), ("F.linear q", lambda: F.linear(x, lin_d.weight)),
                    ("SparseLinear q csr", lambda: lin_s(x)), ("st.linear q csr", lambda: st.linear(x, A)),
                    ("SparseLinear q 2:4", lambda: models["2:4"].q_proj(x)),
                    ("torch.empty", lambda: torch.empty((1, 4096), dtype=torch.float16, device="cuda"))):
        r = host_us(f, 100, 200)
        print(f"{name:>22}: host us median/best {r[0]:.1f} / {r[1]:.1f}", flush=True)
    profile(fns["csr"], "eager_csr")
    profile(lambda: st.linear(x, A), "st_linear_csr", calls=100)
    # compiled, no graphs
    comp = {}
    for k in ("dense", "csr"):
        torch._dynamo.reset()
        comp[k] = call(torch.compile(models[k]))
        for _ in range(3):
            comp[k]()
        torch.cuda.synchronize()
        r = host_us(comp[k])
        print(f"compiled layer {k}: host us median/best {r[0]:.1f} / {r[1]:.1f}", flush=True)
    profile(comp["csr"], "compiled_csr")
    profile(comp["dense"], "compiled_dense")
