"""Block-sparse / Shfl-BW SpMM on the GPU: bf16 too, and the benchmark shapes."""
import pytest
import torch

import spartune as st
from spartune import reference as ref
from spartune.kernels import spmm_blocked as K
from spartune.tune.problem import Problem

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 5e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}  # fp32 runs through tf32


def rel(out, expect):
    return ((out.double() - expect).norm() / expect.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("pattern", ["block:64", "block:32x64", "block:128", "shfl:64", "shfl:32"])
@pytest.mark.parametrize("M, Kd, N", [(11008, 4096, 16), (768, 3072, 300), (1000, 777, 77)])
def test_linear_matches_reference(dtype, pattern, M, Kd, N):
    w = torch.randn(M, Kd, device="cuda")
    A = st.sparsify_weight(w, pattern, 0.9)
    A = A.with_values(A.values.to(dtype))
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    bias, res = torch.randn(M, device="cuda", dtype=dtype), torch.randn(N, M, device="cuda", dtype=dtype)
    expect = ref.linear(x, A, bias, "silu", res, 0.5)
    prob = Problem("linear", A.signature, M, Kd, N, str(dtype).split(".")[1], A.stats())
    configs = K.space(prob)
    assert configs
    for cfg in configs[:: max(1, len(configs) // 4)]:
        out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype)
        K.launch(A, x, out, cfg, bias=bias, activation="silu", residual=res, scale=0.5)
        assert not out.isnan().any(), cfg
        assert rel(out, expect) < TOL[dtype], cfg


def test_spmm_layout_through_strided_views():
    w = torch.randn(512, 384, device="cuda")
    A = st.sparsify_weight(w, "block:64", 0.8)
    A = A.with_values(A.values.half())
    X = torch.randn(384, 100, device="cuda", dtype=torch.float16)
    Y = torch.full((512, 100), float("nan"), device="cuda", dtype=torch.float16)
    K.launch(A, X.T, Y.T, K.Config(64, 64, 4, 3))
    assert rel(Y, ref.spmm(A, X)) < 1e-2
