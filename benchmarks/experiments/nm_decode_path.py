"""Probe (issue 14, 2:4 decode): where the tuned spartune.linear loses against its own best
kernel. Per case: cuBLAS, the kernel launched directly with the best configs of last session's
run 3, spartune.linear as tuned (graph replay: x copied in, then the replay) and with graphs
off, each GPU time with the L2 flushed (do_bench) and as the tuner times it (cold_replay);
host time of back-to-back calls; then what the tuner measured (DB rows)."""
import json, os, sqlite3, time
import torch, torch.nn.functional as F
from triton.testing import do_bench
import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_nm as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import cold_replay

C = K.Config
BEST = {  # run 3's best register / ring configs (benchmarks/results/2026-11-26/issue14)
    ("up", 1): [C(32, 8, 4, 2, 8), C(32, 8, 4, 2, 4, stages=3)],
    ("up", 16): [C(128, 16, 8, 2, 8), C(64, 16, 4, 2, 4, stages=3)],
    ("down", 1): [C(16, 8, 4, 4, 8), C(16, 8, 4, 4, 8, stages=3)],
    ("down", 16): [C(64, 8, 8, 4, 8), C(32, 16, 4, 2, 8, stages=3)],
}
SHAPES = {"up": (11008, 4096), "down": (4096, 11008)}


def t(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def host(fn, calls=300):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6, (time.perf_counter() - t0) / calls * 1e6


for (name, n), cfgs in BEST.items():
    M, Kd = SHAPES[name]
    torch.manual_seed(0)
    w = torch.randn(M, Kd, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "2:4")
    x = torch.randn(n, Kd, device="cuda", dtype=torch.float16)
    out = torch.empty(n, M, device="cuda", dtype=torch.float16)
    row = {"case": f"{name} N={n}", "cublas": t(lambda: F.linear(x, w)), "cublas_host": host(lambda: F.linear(x, w))}
    for c in cfgs:
        k = f"{'ring' if c.stages >= 3 else 'regs'}"
        row[k] = t(lambda: K.launch(A, x, out, c))
        row[k + "_cold_replay"] = cold_replay(lambda: K.launch(A, x, out, c)) * 1e6
        row[k + "_host_issue/wall"] = host(lambda: K.launch(A, x, out, c))
    os.environ["SPARTUNE_GRAPHS"] = "1"
    st.linear(x, A)
    row["tuned_graph"] = t(lambda: st.linear(x, A))
    row["tuned_graph_host"] = host(lambda: st.linear(x, A))
    row["pick"] = [f"{c.backend} {c.config}" for c in dispatch._states[A].chosen.values()]
    A2 = sparsify_weight(w, "2:4")
    os.environ["SPARTUNE_GRAPHS"] = "0"
    st.linear(x, A2)
    row["tuned_direct"] = t(lambda: st.linear(x, A2))
    row["tuned_direct_host"] = host(lambda: st.linear(x, A2))
    os.environ["SPARTUNE_GRAPHS"] = "1"
    print(json.dumps(row), flush=True)

import glob
for path in glob.glob(os.path.join(os.environ["SPARTUNE_CACHE_DIR"], "tuning-v*.sqlite3")):
    con = sqlite3.connect(path)
    for prob, in con.execute("SELECT DISTINCT problem FROM results"):
        print("==", prob[:200])
        for b, c, s, p in con.execute("SELECT backend, config, seconds, predicted FROM results WHERE problem=? ORDER BY seconds", (prob,)):
            print(f"   {b:<16} {(s or 0) * 1e6:8.1f} us  pred {(p or 0) * 1e6:8.1f}  {c[:170]}")
