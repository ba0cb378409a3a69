"""CSR SpMM, SDDMM and sparse softmax on the GPU: the CPU tests' checks plus bf16, every config
of the space and the benchmark shapes (Llama-7B, BERT-base, qkv decode) at density 0.1."""
import pytest
import torch

import spartune as st
from spartune import reference as ref
from spartune.kernels import sddmm, sparse_softmax, spmm_csr
from spartune.tune.problem import Problem

pytestmark = pytest.mark.gpu

# fp32 runs in IEEE fp32 unless torch allows tf32 for matmuls (spmm_csr.dot_precision)
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
DT = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def rel(out, expect):
    out, expect = out.double(), expect.double()
    return ((out - expect).norm() / expect.norm().clamp_min(1e-30)).item()


def tol(dtype):
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return 5e-3
    return TOL[dtype]


def weight(m, k, density, dtype, seed=0, edges=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(m, k, device="cuda", generator=g)
    w = w * (torch.rand(m, k, device="cuda", generator=g) < density)
    if edges:
        w[0] = 0
        w[1] = torch.randn(k, device="cuda", generator=g)
        w[m // 2] = 0
        w[m // 2 + 1] = torch.randn(k, device="cuda", generator=g)
    return w.to(dtype)


def spread(configs, every):
    """Every `every`-th config plus the first of each path: compile time stays bounded."""
    picked = configs[::every]
    for path in dict.fromkeys(c.path for c in configs):
        first = next(c for c in configs if c.path == path)
        if first not in picked:
            picked.append(first)
    return picked


def run_spmm(A, x, config, **epi):
    out = torch.full((x.shape[0], A.shape[0]), float("nan"), device="cuda", dtype=x.dtype)
    spmm_csr.launch(A, x, out, config, **epi)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(300, 500, 1), (300, 500, 16), (257, 1000, 100), (1000, 777, 77), (301, 515, 300)])
def test_spmm_every_config(dtype, M, K, N):
    A = st.CSR.from_dense(weight(M, K, 0.1, dtype, 1))
    x = torch.randn(N, K, device="cuda", dtype=dtype)
    bias, res = torch.randn(M, device="cuda", dtype=dtype), torch.randn(N, M, device="cuda", dtype=dtype)
    expect = ref.linear(x, A, bias, "silu", res, 0.5)
    prob = Problem("linear", "csr", M, K, N, DT[dtype], A.stats())
    space = spmm_csr.space(prob)
    for cfg in space if dtype == torch.float16 else spread(space, 3):
        out = run_spmm(A, x, cfg, bias=bias, activation="silu", residual=res, scale=0.5)
        assert not out.isnan().any(), cfg
        assert rel(out, expect) < tol(dtype), cfg


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,M,K,N", [
    ("llama-up", 11008, 4096, 2048), ("llama-down", 4096, 11008, 2048),
    ("qkv-1", 4096, 4096, 1), ("qkv-16", 4096, 4096, 16), ("qkv-32", 4096, 4096, 32),
    ("bert-ffn1", 3072, 768, 4096), ("bert-ffn2", 768, 3072, 4096),
])
def test_spmm_benchmark_shapes(dtype, name, M, K, N):
    A = st.CSR.from_dense(weight(M, K, 0.1, dtype, 2, edges=False))
    x = torch.randn(N, K, device="cuda", dtype=dtype)
    expect = ref.linear(x, A)
    prob = Problem("linear", "csr", M, K, N, DT[dtype], A.stats())
    space = spmm_csr.space(prob)
    if N > 64:  # prefill: the row path is far too slow to sweep: one config of it
        space = [c for c in space if c.path in ("dense", "expand")] + [c for c in space if c.path == "row"][:1]
    for cfg in spread(space, 2 if dtype == torch.float16 else 4):
        out = run_spmm(A, x, cfg)
        assert not out.isnan().any(), cfg
        assert rel(out, expect) < tol(dtype), cfg


@pytest.mark.parametrize("config", [spmm_csr.Config("row", 4, 16, 64), spmm_csr.Config("row_t", 2, 16, 64),
                                    spmm_csr.Config("dense", 64, 64, 64), spmm_csr.Config("dense", 32, 16, 64, split_k=4),
                                    spmm_csr.Config("expand", 128, 128, 64, num_warps=4, num_stages=4),
                                    spmm_csr.Config("row_t", 1, 32, 256)])
def test_spmm_strided_views_and_out_dtype(config):
    M, K, N = 500, 384, 40
    A = st.CSR.from_dense(weight(M, K, 0.2, torch.float16, 3))
    big = torch.randn(N, 2 * K, device="cuda", dtype=torch.float16)
    x = big[:, ::2]
    out = torch.full((N, M), float("nan"), device="cuda", dtype=torch.float32)
    spmm_csr.launch(A, x, out, config, activation="gelu")
    assert rel(out, ref.linear(x, A, activation="gelu")) < 1e-2
    X = torch.randn(K, N, device="cuda", dtype=torch.float16)
    Y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    spmm_csr.launch(A, X.T, Y.T, config)
    assert not Y.isnan().any() and rel(Y, ref.spmm(A, X)) < 1e-2


def test_spmm_split_is_repeatable_and_leaves_workspace_clean():
    M, K, N = 4096, 4096, 16
    A = st.CSR.from_dense(weight(M, K, 0.1, torch.float16, 4, edges=False))
    cfg = spmm_csr.Config("dense", 32, 16, 128, split_k=8, num_stages=3)
    for _ in range(3):
        x = torch.randn(N, K, device="cuda", dtype=torch.float16)
        assert rel(run_spmm(A, x, cfg), ref.linear(x, A)) < 1e-2
    for tensors in spmm_csr.dense._WORKSPACES.values():
        for t in tensors:
            assert int(t.count_nonzero()) == 0


def test_spmm_empty_and_dense_matrices():
    for w in (torch.zeros(100, 200, device="cuda", dtype=torch.float16),
              torch.randn(100, 200, device="cuda", dtype=torch.float16)):
        A = st.CSR.from_dense(w)
        x = torch.randn(9, 200, device="cuda", dtype=torch.float16)
        b = torch.randn(100, device="cuda", dtype=torch.float16)
        prob = Problem("linear", "csr", 100, 200, 9, "float16", A.stats())
        for cfg in spmm_csr.space(prob):
            out = run_spmm(A, x, cfg, bias=b, activation="relu")
            assert rel(out, ref.linear(x, A, b, "relu")) < 1e-2, cfg


# ------------------------------------------------------------------------------------------
# SDDMM and softmax
# ------------------------------------------------------------------------------------------
def csr_pattern(L, density, dtype, seed):
    return st.CSR.from_dense(weight(L, L, density, dtype, seed))


def block_pattern(L, block, density, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    nb = -(-L // block)
    keep = (torch.rand(nb, nb, device="cuda", generator=g) < density)
    keep = keep.repeat_interleave(block, 0).repeat_interleave(block, 1)[:L, :L]
    return st.BlockSparse.from_dense(torch.randn(L, L, device="cuda", generator=g).to(dtype) * keep, block)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("L,D,density", [(1000, 64, 0.1), (4096, 64, 0.05), (8192, 128, 0.02), (777, 40, 0.3)])
def test_sddmm_every_config(dtype, L, D, density):
    a = torch.randn(L, D, device="cuda", dtype=dtype)
    b = torch.randn(L, D, device="cuda", dtype=dtype)
    for P, fmt in ((csr_pattern(L, density, dtype, 5), "csr"), (block_pattern(L, 64, density * 2, dtype, 6), "block:64x64")):
        expect = ref.sddmm(a, b, P, 0.125)
        prob = Problem("sddmm", fmt, L, L, D, DT[dtype], P.stats())
        space = sddmm.space(prob)
        for cfg in space if dtype == torch.float16 else spread(space, 3):
            vals = sddmm.launch(a, b, P, cfg, scale=0.125)
            assert not vals.isnan().any(), cfg
            assert rel(P.with_values(vals).to_dense(), expect) < tol(dtype), cfg


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_softmax_every_config(dtype):
    for P, fmt in ((csr_pattern(3000, 0.05, dtype, 7), "csr"), (block_pattern(1000, 32, 0.2, dtype, 8), "block:32x32")):
        P = P.with_values(P.values * 3)
        expect = ref.sparse_softmax(P, 0.5)
        prob = Problem("softmax", fmt, P.shape[0], P.shape[1], 0, DT[dtype], P.stats())
        for cfg in sparse_softmax.space(prob) + ([sparse_softmax.Config("row", 2, 32)] if fmt == "csr" else []):
            vals = sparse_softmax.launch(P, cfg, scale=0.5)
            assert not vals.isnan().any(), cfg
            assert rel(P.with_values(vals).to_dense(), expect) < tol(dtype), cfg


def test_spmm_expand_and_row_t_graph_replay():
    """Workspaces are allocated on the first call; CUDA-graph replays then reuse them."""
    for cfg, (M, K, N) in ((spmm_csr.Config("expand", 128, 128, 64, num_warps=4, num_stages=4), (1000, 1000, 512)),
                           (spmm_csr.Config("row_t", 2, 16, 128), (1000, 1000, 16))):
        A = st.CSR.from_dense(weight(M, K, 0.1, torch.float16, 9, edges=False))
        x = torch.randn(N, K, device="cuda", dtype=torch.float16)
        out = torch.empty(N, M, device="cuda", dtype=torch.float16)
        spmm_csr.launch(A, x, out, cfg)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            spmm_csr.launch(A, x, out, cfg)
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel(out, ref.linear(x, A)) < 1e-2, cfg
