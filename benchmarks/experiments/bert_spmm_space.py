"""One-off probe (issue 18): BERT-base's SpMMs at N = 4096, block:64 90%: the whole blocked
space (plus single-stage configs) against the tuned pick and the byte floor.
    python benchmarks/experiments/bert_spmm_space.py"""
import dataclasses, torch, triton
from triton.testing import do_bench
import spartune as st
from spartune.kernels import spmm_blocked
from spartune.tune.problem import Problem

N = 4096
gen = torch.Generator(device="cuda").manual_seed(0)
for name, M, K, act in (("qkv", 2304, 768, None), ("attn-out", 768, 768, None), ("ffn1", 3072, 768, "gelu"),
                        ("ffn2", 768, 3072, None)):
    keep = torch.rand(M // 64, K // 64, generator=gen, device="cuda") < 0.1
    w = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=gen) * keep.repeat_interleave(64, 0).repeat_interleave(64, 1)
    A = st.BlockSparse.from_dense(w, (64, 64))
    x = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=gen)
    bias = torch.randn(M, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(N, M, device="cuda", dtype=torch.float16)
    ref = torch.nn.functional.linear(x.float(), w.float(), bias.float())
    ref = torch.nn.functional.gelu(ref) if act else ref
    prob = Problem("linear", "block:64x64", M, K, N, "float16", A.stats())
    space = spmm_blocked.space(prob)
    extra = [dataclasses.replace(c, num_stages=1) for c in space if c.num_stages == 2]
    rows = []
    for cfg in space + extra:
        try:
            fn = lambda: spmm_blocked.launch(A, x, out, cfg, bias=bias, activation=act)  # noqa: E731
            fn()
            if not ((out.float() - ref).norm() / ref.norm()).item() < 1e-2:
                continue
            rows.append((do_bench(fn, warmup=5, rep=25) * 1e3, cfg))
        except Exception:
            continue
    rows.sort(key=lambda r: r[0])
    floor = (N * K + N * M + A.nnz) * 2 / 3.35e12 * 1e6
    picked = do_bench(lambda: st.linear(x, A, bias, activation=act), warmup=5, rep=25) * 1e3
    dense = do_bench(lambda: torch.nn.functional.linear(x, w, bias), warmup=5, rep=25) * 1e3
    one = [r for r in rows if r[1].num_stages == 1]
    print(f"\n{name} {M}x{K} N={N}: floor {floor:.1f} us, dense {dense:.1f}, tuned pick {picked:.1f}, "
          f"best {rows[0][0]:.1f} ({rows[0][1]}), best 1-stage {one[0][0] if one else float('nan'):.1f}; {len(rows)} ran")
    for t, c in rows[:6]:
        print(f"   {t:6.1f} us  {c}")
