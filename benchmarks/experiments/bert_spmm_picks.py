"""One-off probe (issue 18): BERT-base's SpMMs at N = 4096, block:64 90%, timed as inside a
CUDA graph (no L2 flush): the tuner's pick against the best of the space, and what the GELU
epilogue costs.   python benchmarks/experiments/bert_spmm_picks.py"""
import os
import torch
from triton.testing import do_bench_cudagraph
import spartune as st
from spartune import dispatch
from spartune.bench.picks import label
from spartune.kernels import spmm_blocked
from spartune.tune.problem import Problem

N = 4096
gen = torch.Generator(device="cuda").manual_seed(0)
t = lambda fn: do_bench_cudagraph(fn, rep=20) * 1e3  # noqa: E731
for name, M, K, act in (("ffn1", 3072, 768, "gelu"), ("qkv", 2304, 768, None), ("attn-out", 768, 768, None),
                        ("ffn2", 768, 3072, None)):
    if os.environ.get("ONLY") and name != os.environ["ONLY"]:
        continue
    keep = torch.rand(M // 64, K // 64, generator=gen, device="cuda") < 0.1
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen) * keep.repeat_interleave(64, 0).repeat_interleave(64, 1)
    A = st.BlockSparse.from_dense(w, (64, 64))
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
    bias = torch.randn(M, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    st.linear(x, A, bias, activation=act)  # tunes
    picks = [label(c.backend, c.config) for c in dispatch._states[A].chosen.values()]
    from spartune.backends import direct_launches
    with direct_launches():
        picked = t(lambda: st.linear(x, A, bias, activation=act))
    prob = Problem("linear", "block:64x64", M, K, N, "float16", A.stats())
    rows = {}
    for a in ((act, None) if act else (None,)):
        best = (float("inf"), None)
        for cfg in [c for c in spmm_blocked.space(prob) if c.bn >= 64 and c.num_stages in (2, 3, 5)]:
            try:
                best = min(best, (t(lambda: spmm_blocked.launch(A, x, out, cfg, bias=bias, activation=a)), str(cfg)))
            except Exception:
                continue
        rows[a] = best
    floor = (N * K + N * M + A.nnz) * 2 / 3.35e12 * 1e6
    dense = t(lambda: torch.nn.functional.linear(x, w, bias))
    print(f"{name} {M}x{K}: floor {floor:.1f} us, dense {dense:.1f}, pick {picked:.1f} ({picks}), "
          + ", ".join(f"best act={a} {v[0]:.1f} ({v[1]})" for a, v in rows.items()), flush=True)
