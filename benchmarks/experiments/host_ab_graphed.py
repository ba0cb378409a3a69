"""Probe (session 44): in one process, rounds in turns, the eager Llama-7B decode layer (csr 90%)
with its Triton calls launched through launch_cached (now) or replayed from per-call CUDA graphs
(the route removed at this commit, re-created here), and the dense layer beside."""
import copy, os, statistics, time
import torch
from spartune import backends, dispatch
from spartune.bench import e2e
from spartune.dispatch import outside_graph_pools
from spartune.formats import memo
from spartune.nn import sparsify


def _graphed(launch, key):  # dispatch._graphed as it was before this commit
    def run(A, x, out, bias, act, res, scale, prologue=None):
        if not backends.replays_allowed():
            return launch(A, x, out, bias, act, res, scale)
        pool = memo(A, "_graphs", dict).setdefault((key, x.stride(), scale), [])
        replay = next((g for g in pool if g.free()), None)
        if replay is None and len(pool) < 4:
            static_out = torch.empty_like(out)
            replay = outside_graph_pools(lambda: backends.GraphReplay(
                lambda xs, bs: launch(A, xs, static_out, bs, act, None, scale),
                x.clone(), None if bias is None else bias.clone()), A.device)
            pool.append(replay)
        if replay is None:
            return launch(A, x, out, bias, act, res, scale)
        return replay(x, bias)[...]
    return run


def host_us(fn, calls=10, bound_us=1500, reps=15):
    fn(); torch.cuda.synchronize()
    s = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(calls * bound_us * 2e3))
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        s.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(s)


MODE = {"graphed": False}
with torch.no_grad():
    w = [x for x in e2e.WORKLOADS if x.name == "llama7b-layer decode N=1"][0]
    dense, call = w.build(torch.float16, "cuda", False)
    sparse = copy.deepcopy(dense)
    sparsify(sparse, "csr", 0.9)
    fd, fs = call(dense), call(sparse)
    fs(); torch.cuda.synchronize()
    wrapped = 0
    for mod in sparse.modules():
        if hasattr(mod, "_weight") and mod._weight in dispatch._states:
            st = dispatch._states[mod._weight]
            for key, launch in list(st.launchers.items()):
                if st.chosen[key].backend == "csr":
                    g = _graphed(launch, (key, "csr", st.chosen[key].config))
                    st.launchers[key] = (lambda d, g: lambda *a: (g if MODE["graphed"] else d)(*a))(launch, g)
                    wrapped += 1
    print("csr calls wrapped:", wrapped)
    q = sparse.q_proj
    xq = torch.randn(1, 1, 4096, device="cuda", dtype=torch.float16)
    ref = {}
    for m in (False, True):
        MODE["graphed"] = m
        ref[m] = fs().double()
    print("outputs agree:", float((ref[False] - ref[True]).abs().max()))
    rows = []
    for r in range(6):
        row = {"dense": host_us(fd)}
        for m in (False, True):
            MODE["graphed"] = m
            row["graphed" if m else "cached"] = host_us(fs)
            row["q " + ("graphed" if m else "cached")] = host_us(lambda: q(xq), calls=100, bound_us=150, reps=9)
        rows.append(row)
        print(" ".join(f"{k} {v:7.1f}" for k, v in row.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("median:", " ".join(f"{k} {v:7.1f}" for k, v in med.items()))
    print("x dense (host): cached %.2f graphed %.2f" % (statistics.median(r["dense"] / r["cached"] for r in rows),
                                                       statistics.median(r["dense"] / r["graphed"] for r in rows)))
