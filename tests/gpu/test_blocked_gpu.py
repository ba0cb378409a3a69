"""Block-sparse / Shfl-BW SpMM on the GPU: bf16 too, and the benchmark shapes."""
import pytest
import torch

import spartune as st
from spartune import reference as ref
from spartune.kernels import spmm_blocked as K
from spartune.tune.problem import Problem

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 5e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}  # fp32 runs through tf32


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu"])
def test_epilogue_activations_at_fp32_accuracy(name):
    """The activations every Triton family's epilogue applies, with the GPU's exp and division."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "kernels" / "test_activation.py"
    spec = importlib.util.spec_from_file_location("activation_checks", path)
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    checks.check_activation(name, "cuda")


def rel(out, expect):
    return ((out.double() - expect).norm() / expect.norm()).item()


def random_format(pattern, M, Kd, density, dtype):
    """Uniform random blocks (or Shfl-BW groups with random kept columns), without pruning cost."""
    p = st.parse_pattern(pattern)
    bm, bk = (p.bm, p.bk) if p.kind == "block" else (p.bm, 1)
    keep = torch.rand(-(-M // bm), -(-Kd // bk), device="cuda") < density
    w = torch.randn(M, Kd, device="cuda") * keep.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:M, :Kd]
    w = w.to(dtype)
    if p.kind == "block":
        return st.BlockSparse.from_dense(w, (bm, bk))
    perm = torch.randperm(M, device="cuda").to(torch.int32)
    shuffled = torch.empty_like(w)
    shuffled[perm.long()] = w
    return st.ShuffledBlock.from_dense(shuffled, bm, perm)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("pattern", ["block:64", "block:32x64", "block:128", "shfl:64", "shfl:32"])
@pytest.mark.parametrize("M, Kd, N", [(11008, 4096, 16), (768, 3072, 300), (1000, 777, 77)])
def test_linear_matches_reference(dtype, pattern, M, Kd, N):
    A = random_format(pattern, M, Kd, 0.1, dtype)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    bias, res = torch.randn(M, device="cuda", dtype=dtype), torch.randn(N, M, device="cuda", dtype=dtype)
    expect = ref.linear(x, A, bias, "silu", res, 0.5)
    configs = K.space(Problem("linear", A.signature, M, Kd, N, str(dtype).split(".")[1], A.stats()))
    assert configs
    for cfg in configs[:: max(1, len(configs) // 3)]:
        out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype)
        K.launch(A, x, out, cfg, bias=bias, activation="silu", residual=res, scale=0.5)
        assert not out.isnan().any(), cfg
        assert rel(out, expect) < TOL[dtype], cfg


@pytest.mark.parametrize("tma", [False, True])
def test_spmm_layout_through_strided_views(tma):
    A = random_format("block:64", 512, 384, 0.3, torch.float16)
    X = torch.randn(384, 100, device="cuda", dtype=torch.float16)
    Y = torch.full((512, 100), float("nan"), device="cuda", dtype=torch.float16)
    K.launch(A, X.T, Y.T, K.Config(64, 64, 4, 3, 8, tma))
    assert rel(Y, ref.spmm(A, X)) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["block:64", "shfl:64"])
@pytest.mark.parametrize("act", ["relu", None])
def test_input_prologue_on_every_load_path(dtype, pattern, act):
    """act(x + x_bias) applied as x loads, by the TMA, persistent and pointer paths (K = 1000:
    the last block runs past K, where the prologue must leave the zero padding at zero)."""
    M, Kd, N = 512, 1000, 300
    A = random_format(pattern, M, Kd, 0.3, dtype)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    x_bias = torch.randn(Kd, device="cuda", dtype=dtype)
    bias = torch.randn(M, device="cuda", dtype=dtype)
    expect = ref.linear(x, A, bias, "relu", prologue=(x_bias, act))
    configs = K.space(Problem("linear", A.signature, M, Kd, N, str(dtype).split(".")[1], A.stats()))
    picked = {(c.tma, c.persistent): c for c in configs}.values()  # one config of each load path
    for cfg in picked:
        out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype)
        K.launch(A, x, out, cfg, bias=bias, activation="relu", prologue=(x_bias, act))
        assert not out.isnan().any(), cfg
        assert rel(out, expect) < TOL[dtype], cfg


def test_input_prologue_pass_for_the_other_backends():
    """The pass that runs the prologue before a kernel that does not fuse it (csr, N:M, cuBLAS)."""
    from spartune.epilogue import apply_prologue
    from spartune.kernels import prologue

    x = torch.randn(1000, 300, device="cuda", dtype=torch.float16)[:, :250]  # strided rows
    x_bias = torch.randn(250, device="cuda", dtype=torch.float16)
    for act in (None, "relu", "gelu"):
        got = prologue.apply(x, x_bias, act)
        torch.testing.assert_close(got, apply_prologue(x, x_bias, act), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("tma", [False, True])
def test_cached_launches_follow_each_call(tma):
    """launch() calls the compiled kernel directly once a specialisation has run
    (kernels/_common.launch_cached): every change that re-specialises the kernel must launch the
    right compiled variant. Calls alternate between x contiguous, aligned with a wide row pitch,
    misaligned with the same pitch, and strided; out, bias and residual aligned or not; two out
    dtypes; with and without bias and residual; token counts divisible by 16 and not, and 1.
    Each against the float64 reference with the output poisoned first."""
    dtype = torch.float16
    A = random_format("block:64", 512, 384, 0.3, dtype)
    cfg = K.Config(bn=64, bk=64, num_warps=4, num_stages=2, group=8, tma=tma)

    def misaligned(shape, dt, fill=None):  # a view 2 bytes past a 16-byte boundary
        flat = torch.randn(int(torch.tensor(shape).prod()) + 1, device="cuda").to(dt)
        if fill is not None:
            flat.fill_(fill)
        return flat[1:].view(shape)

    cases = []
    for N in (64, 77, 64, 1, 64):
        for view in ("plain", "wide", "offset", "strided", "plain"):
            for out_dtype, with_bias, with_res, aligned in ((dtype, True, False, True), (torch.float32, False, True, True),
                                                            (dtype, True, True, False), (dtype, True, False, True)):
                cases.append((N, view, out_dtype, with_bias, with_res, aligned))
    calls = 0
    for N, view, out_dtype, with_bias, with_res, aligned in cases + cases[::-1]:
        base = torch.randn(N + 1, 384 * 2 + 8, device="cuda", dtype=dtype)
        x = {"plain": base[:N, :384].contiguous(), "wide": base[:N, :384], "offset": base[1:, 1:385],
             "strided": base[:N, ::2][:, :384]}[view]
        if aligned:
            res = torch.randn(N, 512, device="cuda", dtype=out_dtype) if with_res else None
            b = torch.randn(512, device="cuda", dtype=dtype) if with_bias else None
            out = torch.full((N, 512), float("nan"), device="cuda", dtype=out_dtype)
        else:
            res = misaligned((N, 512), out_dtype) if with_res else None
            b = misaligned((512,), dtype) if with_bias else None
            out = misaligned((N, 512), out_dtype, fill=float("nan"))
        expect = ref.linear(x, A, b, "relu", res, 1.0)
        K.launch(A, x, out, cfg, bias=b, activation="relu", residual=res)
        calls += 1
        case = (N, view, out_dtype, with_bias, with_res, aligned)
        assert not out.isnan().any(), case
        assert rel(out, expect) < TOL[dtype], case
    # every launch past the first of its specialisation went the direct way
    assert 0 < len(A.__dict__["_blocked_launches"]) < calls // 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_shfl_chain_in_the_tokens_contiguous_layout(dtype):
    """Two Shfl-BW layers through spartune.linear with x = X.T: the first one's output keeps that
    layout and the second reads it in place; the tuner may pick any backend, the values must be
    the float64 product's (tests/test_ops.py checks the layout with each backend forced)."""
    A1 = random_format("shfl:64", 1536, 512, 0.15, dtype)
    A2 = random_format("shfl:32", 384, 1536, 0.15, dtype)
    x = torch.randn(512, 1000, device="cuda", dtype=dtype).T  # N = 1000 tokens, contiguous
    h = st.linear(x, A1, activation="gelu")
    y = st.linear(h, A2)
    expect_h = ref.linear(x, A1, activation="gelu")
    assert rel(h, expect_h) < TOL[dtype]
    assert rel(y, ref.linear(h, A2)) < TOL[dtype]
