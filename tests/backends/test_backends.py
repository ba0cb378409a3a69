"""The library backends on the CPU: the weight conversions the tuner and the benchmark share,
the dense fallbacks of sddmm / sparse_softmax against spartune.reference (every value), and
which backends the tuner is offered."""
import warnings

import pytest
import torch

import spartune as st
from spartune import backends
from spartune.backends import _common
from spartune import reference as ref
from spartune.backends import cusparse
from helpers import block_weight, random_weight


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _patterns():
    """CSR with empty rows, block-sparse of whole blocks and with partial (padded) blocks."""
    w = random_weight(40, 24, 0.3, gen=_gen(1))
    w[3] = 0  # an empty row
    yield "csr", st.CSR.from_dense(w)
    yield "block whole", st.BlockSparse.from_dense(block_weight(64, 96, 32, 32, 0.5, gen=_gen(2)), (32, 32))  # square: CPU BSR products
    yield "block padded", st.BlockSparse.from_dense(block_weight(40, 50, 16, 16, 0.5, gen=_gen(3)), (16, 16))


PATTERNS = dict(_patterns())


# --- conversions ---------------------------------------------------------------------------------
def test_to_bsr_and_csr_hold_the_weight():
    w = block_weight(64, 96, 16, 32, 0.4, gen=_gen(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "beta state" warning is silenced inside
        bsr, csr = cusparse.to_bsr(w, (16, 32)), cusparse.to_csr(w)
    assert bsr.layout == torch.sparse_bsr and tuple(bsr.values().shape[1:]) == (16, 32)
    assert csr.layout == torch.sparse_csr
    assert torch.equal(bsr.to_dense(), w) and torch.equal(csr.to_dense(), w)


def test_to_bsr_needs_whole_blocks():
    with pytest.raises(RuntimeError, match="multiples of the block 16x16"):
        cusparse.to_bsr(torch.ones(40, 48), (16, 16))
    assert cusparse.whole_blocks((64, 96), (16, 32)) and not cusparse.whole_blocks((40, 48), (16, 16))


@pytest.mark.parametrize("name,layout", [("csr", torch.sparse_csr), ("block whole", torch.sparse_bsr),
                                         ("block padded", torch.sparse_csr)])
def test_the_tuners_cusparse_weight(name, layout):
    """BSR for whole blocks, CSR otherwise; converted once per format object."""
    A = PATTERNS[name]
    ws = cusparse.torch_sparse(A)
    assert ws.layout == layout and torch.equal(ws.to_dense(), A.to_dense())
    if layout == torch.sparse_bsr:
        assert tuple(ws.values().shape[1:]) == A.block
    x = torch.randn(5, A.shape[1], generator=_gen(5))
    out = torch.empty(5, A.shape[0])
    y = cusparse.cusparse_linear(A, x, out)
    assert y.data_ptr() == out.data_ptr()
    torch.testing.assert_close(y.double(), ref.linear(x, A), rtol=1e-5, atol=1e-5)
    assert backends.dense_weight(A) is backends.dense_weight(A)  # cached per format object
    B = A.with_values(A.values * 2)
    assert not torch.equal(backends.dense_weight(B), backends.dense_weight(A))


def test_dense_linear_epilogue():
    A = PATTERNS["csr"]
    x, bias, res = (torch.randn(*s, generator=_gen(6)) for s in ((5, 24), (40,), (5, 40)))
    out = torch.full((5, 40), float("nan"))
    plain = backends.dense_linear(A, x, out, bias=bias)  # F.linear's own result: no copy
    torch.testing.assert_close(plain.double(), ref.linear(x, A, bias), rtol=1e-5, atol=1e-5)
    y = backends.dense_linear(A, x, out, bias=bias, activation="relu", residual=res, scale=0.5)
    assert y is out
    torch.testing.assert_close(y.double(), ref.linear(x, A, bias, "relu", res, 0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("with_bias, with_res, scale", [(True, False, 1.0), (False, True, 1.0), (True, True, 1.0),
                                                        (True, True, 0.5), (False, False, 2.0)])
def test_every_epilogue_route_of_the_libraries(dtype, activation, with_bias, with_res, scale):
    """dense_linear's routes (bias in cuBLAS, residual as the GEMM's C, in place in the output
    dtype, fp32 otherwise) and finish's, against the float64 reference; x and the epilogue
    tensors the caller gave are left as they were."""
    A = PATTERNS["csr"]
    A = A.with_values(A.values.to(dtype))
    x, bias, res = (torch.randn(*s, generator=_gen(7)).to(dtype) for s in ((5, 24), (40,), (5, 40)))
    kept = [t.clone() for t in (x, bias, res)]
    bias, res = (bias if with_bias else None), (res if with_res else None)
    expect = ref.linear(x, A, bias, activation, res, scale)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    for run in (backends.dense_linear,
                lambda A, x, out, **epi: _common.finish(x @ backends.dense_weight(A).T, out, **epi)):
        out = torch.full((5, 40), float("nan"), dtype=dtype)
        y = run(A, x, out, bias=bias, activation=activation, residual=res, scale=scale)
        torch.testing.assert_close(y.double(), expect, **tol)
    for t, k in zip((x, bias, res), kept):
        assert t is None or torch.equal(t, k)


def test_library_backends_on_the_cpu():
    for A in PATTERNS.values():
        assert backends.library_backends(A) == {"dense": backends.dense_linear}


# --- dense sddmm / sparse_softmax fallbacks ---------------------------------------------------
@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dense_sddmm_matches_the_reference(name, dtype):
    P = PATTERNS[name].with_values(PATTERNS[name].values.to(dtype))
    M, N = P.shape
    a, b = torch.randn(M, 8, generator=_gen(7)).to(dtype), torch.randn(N, 8, generator=_gen(8)).to(dtype)
    values = backends.dense_sddmm(a, b, P, 0.5)
    assert values.shape == P.values.shape and values.dtype == dtype
    expect = ref.sddmm(a, b, P, 0.5)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    got = P.with_values(values).to_dense().double()
    torch.testing.assert_close(got, expect, rtol=tol, atol=tol)  # every stored value, zeros elsewhere
    order = backends.value_order(P)  # stored values in row-major order of (row, col)
    torch.testing.assert_close(values.reshape(-1).double()[order], expect[P.mask()], rtol=tol, atol=tol)
    unstored = torch.ones(values.numel(), dtype=torch.bool)
    unstored[order] = False  # padding slots of partial blocks: left zero
    assert not values.reshape(-1)[unstored].any()


@pytest.mark.parametrize("name", list(PATTERNS))
def test_dense_softmax_matches_the_reference(name):
    A = PATTERNS[name]
    values = backends.dense_softmax(A, 0.7)
    expect = ref.sparse_softmax(A, 0.7)
    torch.testing.assert_close(A.with_values(values).to_dense().double(), expect, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(values.reshape(-1).double()[backends.value_order(A)], expect[A.mask()])
    rows = A.with_values(values).to_dense().sum(1)
    nonempty = A.mask().any(1)
    torch.testing.assert_close(rows[nonempty], torch.ones(int(nonempty.sum())))
    assert not rows[~nonempty].any()  # an empty row stays empty


def test_stored_positions_are_memoised_with_the_pattern():
    """The gather positions are computed once per pattern, and new values keep them."""
    A = PATTERNS["block padded"]
    positions = A.stored_positions()
    assert A.stored_positions() is positions
    B = A._with_values_trusted(backends.dense_softmax(A, 1.0))
    assert B.stored_positions() is positions


def test_cusparselt_offered_for_2to4_half_on_cuda_only(monkeypatch):
    """On CUDA (faked: no kernel runs), both cuSPARSELt algorithms are offered for 2:4 fp16/bf16
    weights only; on the CPU, never."""
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0]]).repeat(4, 4)  # 1:4, so 2:4 too
    made = {(n, m, dt): st.NM.from_dense(w.to(dt), n, m)
            for n, m in ((2, 4), (1, 4)) for dt in (torch.float16, torch.bfloat16, torch.float32)}
    for A in made.values():
        assert backends.library_backends(A) == {"dense": backends.dense_linear}
    monkeypatch.setattr(st.NM, "device", property(lambda self: torch.device("cuda")))
    for (n, m, dt), A in made.items():
        names = set(backends.library_backends(A))
        offered = (n, m) == (2, 4) and dt != torch.float32
        assert ({"cusparselt", "cusparselt_search"} <= names) == offered
        assert ("cusparselt" in names or "cusparselt_search" in names) == offered


def test_cusparselt_refuses_too_few_tokens_before_calling_it():
    from spartune.backends import cusparselt

    A = st.NM.from_dense(torch.tensor([[1.0, 0.0, 2.0, 0.0]]).repeat(8, 2).half(), 2, 4)
    for fn in (cusparselt.cusparselt_linear, cusparselt.cusparselt_search_linear):
        with pytest.raises(cusparselt.CusparseltUnsupported, match="at least 8 tokens"):
            fn(A, torch.ones(1, 8, dtype=torch.float16), torch.empty(1, 8, dtype=torch.float16))
