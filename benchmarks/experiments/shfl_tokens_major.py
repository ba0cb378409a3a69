"""Shfl-BW linear layout: the tokens_major config against the plain gather and block:64, timed
directly (L2 flushed), and what the tuner measured for the problem."""
import torch

import spartune as st
from spartune import dispatch
from spartune.kernels import spmm_blocked as K
from spartune.prune import sparsify_weight
from spartune.tune.measure import time_callable

torch.manual_seed(0)
for m, k, n in [(11008, 4096, 2048), (3072, 768, 4096)]:
    w = torch.randn(m, k, device="cuda", dtype=torch.float16)
    A = sparsify_weight(w, "shfl:64", 0.9)
    x = torch.randn(n, k, device="cuda", dtype=torch.float16)
    out = torch.empty(n, m, device="cuda", dtype=torch.float16)
    ref = x.float() @ A.to_dense().float().T
    for cfg in (K.Config(256, 64, 4, 2, 8), K.Config(256, 64, 4, 2, 8, tokens_major=True),
                K.Config(128, 64, 4, 3, 8, tokens_major=True), K.Config(128, 32, 4, 2, 8, tokens_major=True)):
        out.fill_(float("nan"))
        K.launch(A, x, out, cfg)
        err = float((out.float() - ref).norm() / ref.norm())
        t = time_callable(lambda: K.launch(A, x, out, cfg))
        print(f"{m}x{k} N={n} {cfg}: {t * 1e6:.1f} us, rel err {err:.1e}")
    t = time_callable(lambda: x.t().contiguous())
    print(f"   the copy alone: {t * 1e6:.1f} us; dense {time_callable(lambda: torch.nn.functional.linear(x, w)) * 1e6:.1f} us")
    st.linear(x, A)
    print("   tuner:", dispatch.find_choice(A, n, "float16"))
    rows = dispatch.get_tuner().db.results()
    for r in sorted((r for r in rows if r.get("problem", "").find(f"{m}") >= 0 or True), key=lambda r: r["seconds"] or 1)[:10]:
        print("     ", r.get("backend"), r.get("config"), r.get("seconds"), (r.get("error") or "")[:100])
