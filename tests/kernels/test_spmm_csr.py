"""CSR SpMM, SDDMM and sparse softmax kernels under Triton's interpreter (fp32, fp16) against the
float64 reference: every config family, odd shapes, empty / full / very long rows, strided
views, every epilogue, poisoned outputs."""
import pytest
import torch

import spartune as st
from spartune import reference as ref
from spartune.kernels import sddmm, sparse_softmax, spmm_csr
from spartune.tune.problem import Epilogue, KernelFeatures, Problem
from helpers import block_weight, random_weight, rel_err

TOL = {torch.float32: 1e-5, torch.float16: 1e-2}
DTYPES = {torch.float32: "float32", torch.float16: "float16"}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _weight(m, k, density, dtype, seed, structure="random"):
    g = _gen(seed)
    w = random_weight(m, k, density, gen=g)
    if structure == "edges":  # empty rows, a full row, a very long row next to empty ones
        w[0] = 0
        w[1] = torch.randn(k, generator=g)
        w[m // 2] = 0
        w[m // 2 + 1] = torch.randn(k, generator=g)
        w[m // 2 + 2] = 0
        w[-1] = 0
    elif structure == "empty":
        w.zero_()
    elif structure == "dense":
        w = torch.randn(m, k, generator=g)
    return w.to(dtype)


def _problem(op, fmt, A, m, k, n, dtype, epi=Epilogue()):
    return Problem(op, fmt, m, k, n, DTYPES.get(dtype, "float32"), A.stats(), epi)


def _check_features(f):
    assert isinstance(f, KernelFeatures)
    assert f.programs >= 1 and f.tiles >= 1 and f.steps_max >= 0 and f.dram_bytes > 0
    assert f.l2_bytes >= 0 and f.num_warps in (1, 2, 4, 8, 16) and f.smem_bytes < 228 * 1024


# ------------------------------------------------------------------------------------------
# SpMM
# ------------------------------------------------------------------------------------------
def _run_spmm(A, x, config, out_dtype=None, **epi):
    n, m = x.shape[0], A.shape[0]
    out = torch.full((n, m), float("nan"), dtype=out_dtype or x.dtype)
    spmm_csr.launch(A, x, out, config, **epi)
    return out


def _assert_spmm(out, x, A, dtype, **epi):
    assert not out.isnan().any(), "an output element was not written"
    expect = ref.linear(x, A, epi.get("bias"), epi.get("activation"), epi.get("residual"), epi.get("scale", 1.0))
    err = rel_err(out, expect)
    assert err <= TOL[dtype], err


def _spmm_space(m, k, n, dtype=torch.float32, A=None):
    A = A if A is not None else st.CSR.from_dense(_weight(m, k, 0.2, dtype, 0))
    return spmm_csr.space(_problem("linear", "csr", A, m, k, n, dtype))


def _cases():
    """Every config of the space for a decode-sized and a wider problem, each exactly once."""
    seen, out = set(), []
    for n in (7, 40):
        for c in _spmm_space(45, 70, n):
            if c not in seen:
                seen.add(c)
                out.append(pytest.param(n, c, id=f"n{n}-{c.path}-{c.block_m}x{c.block_n}x{c.block_k}-s{c.split_k}"))
    return out


@pytest.mark.parametrize("n,config", _cases())
def test_spmm_every_config(n, config):
    w = _weight(45, 70, 0.2, torch.float32, 1, "edges")
    A = st.CSR.from_dense(w)
    x = torch.randn(n, 70, generator=_gen(2))
    _assert_spmm(_run_spmm(A, x, config), x, A, torch.float32)


def test_spmm_space_has_both_paths_and_features():
    for m, k, n in ((45, 70, 1), (45, 70, 16), (11008, 4096, 2048), (4096, 4096, 16), (768, 3072, 4096)):
        A = st.CSR.from_dense(_weight(min(m, 64), min(k, 64), 0.1, torch.float32, 3))
        prob = Problem("linear", "csr", m, k, n, "float16", A.stats())
        space = spmm_csr.space(prob)
        assert {"row", "dense"} <= {c.path for c in space} <= set(spmm_csr.PATHS)
        assert ("row_t" in {c.path for c in space}) == (1 < n <= 64)
        if 1 < n <= 64:  # x = X.T already has its tokens adjacent: no copy path
            spmm_prob = Problem("linear", "csr", m, k, n, "float16", A.stats(), layout="spmm")
            assert "row_t" not in {c.path for c in spmm_csr.space(spmm_prob)}
        assert 4 <= len(space) <= 40 and len(set(space)) == len(space)
        for c in space:
            assert c.block_k % 32 == 0 or c.path == "row"
            _check_features(spmm_csr.features(prob, c))


ROW = spmm_csr.Config("row", 4, 8, 32)
ROW_T = spmm_csr.Config("row_t", 2, 16, 64)
DENSE = spmm_csr.Config("dense", 32, 16, 64, num_stages=3)
SPLIT = spmm_csr.Config("dense", 16, 16, 32, num_stages=3, split_k=3)
EXPAND = spmm_csr.Config("expand", 32, 16, 32, num_stages=2)
ELL = spmm_csr.Config("ell", 2, 8, 32)
PATHS = [pytest.param(ROW, id="row"), pytest.param(ROW_T, id="row_t"), pytest.param(DENSE, id="dense"),
         pytest.param(SPLIT, id="split"), pytest.param(EXPAND, id="expand"), pytest.param(ELL, id="ell")]


@pytest.mark.parametrize("config", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("structure", ["random", "edges", "empty", "dense"])
def test_spmm_structures(config, dtype, structure):
    m, k, n = 37, 101, 5
    A = st.CSR.from_dense(_weight(m, k, 0.15, dtype, 4, structure))
    x = torch.randn(n, k, generator=_gen(5)).to(dtype)
    _assert_spmm(_run_spmm(A, x, config), x, A, dtype)


@pytest.mark.parametrize("config", PATHS)
@pytest.mark.parametrize("n", [1, 7, 77])
def test_spmm_token_counts(config, n):
    if n == 77 and config in (SPLIT, ROW_T):
        pytest.skip("one wide case per path is enough")
    m, k = 29, 66
    A = st.CSR.from_dense(_weight(m, k, 0.3, torch.float16, 6, "edges"))
    x = torch.randn(n, k, generator=_gen(7)).half()
    _assert_spmm(_run_spmm(A, x, config), x, A, torch.float16)


@pytest.mark.parametrize("config", PATHS)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_spmm_epilogue(config, activation):
    m, k, n = 30, 50, 6
    A = st.CSR.from_dense(_weight(m, k, 0.25, torch.float32, 8, "edges"))
    g = _gen(9)
    x, bias, res = torch.randn(n, k, generator=g), torch.randn(m, generator=g), torch.randn(n, m, generator=g)
    epi = dict(bias=bias, activation=activation, residual=res, scale=0.7)
    _assert_spmm(_run_spmm(A, x, config, **epi), x, A, torch.float32, **epi)


@pytest.mark.parametrize("config", PATHS)
def test_spmm_bias_only_and_scale_only(config):
    m, k, n = 30, 50, 3
    A = st.CSR.from_dense(_weight(m, k, 0.25, torch.float16, 10, "edges"))
    g = _gen(11)
    x, bias = torch.randn(n, k, generator=g).half(), torch.randn(m, generator=g).half()
    _assert_spmm(_run_spmm(A, x, config, bias=bias), x, A, torch.float16, bias=bias)
    _assert_spmm(_run_spmm(A, x, config, scale=-2.5), x, A, torch.float16, scale=-2.5)


@pytest.mark.parametrize("config", PATHS)
def test_spmm_out_dtype_differs(config):
    m, k, n = 30, 50, 4
    A = st.CSR.from_dense(_weight(m, k, 0.25, torch.float16, 12))
    x = torch.randn(n, k, generator=_gen(13)).half()
    out = _run_spmm(A, x, config, out_dtype=torch.float32, activation="relu")
    assert out.dtype == torch.float32
    _assert_spmm(out, x, A, torch.float16, activation="relu")
    A32 = st.CSR.from_dense(_weight(m, k, 0.25, torch.float32, 12))
    x32 = x.float()
    out = _run_spmm(A32, x32, config, out_dtype=torch.float16)
    _assert_spmm(out, x32, A32, torch.float16)


@pytest.mark.parametrize("config", PATHS)
def test_spmm_strided_views(config):
    """x = big[:, ::2]; spmm's layout (x = X.T, Y.T as out); a strided residual."""
    m, k, n = 26, 45, 6
    A = st.CSR.from_dense(_weight(m, k, 0.3, torch.float32, 14, "edges"))
    g = _gen(15)
    big = torch.randn(n, 2 * k + 3, generator=g)
    x = big[:, 1::2][:, :k]
    res_big = torch.randn(m, 2 * n, generator=g)
    res = res_big[:, ::2].T  # (n, m) with strides (2, 2n)
    out = _run_spmm(A, x, config, residual=res)
    _assert_spmm(out, x, A, torch.float32, residual=res)
    X = torch.randn(k, n, generator=g)  # spmm(A, X) = launch(A, X.T, Y.T)
    Y = torch.full((m, n), float("nan"))
    spmm_csr.launch(A, X.T, Y.T, config)
    assert not Y.isnan().any()
    assert rel_err(Y, ref.spmm(A, X)) <= 1e-5


def test_spmm_int32_indices():
    """K >= 32768: int32 column indices; one decode-sized product per path."""
    m, k, n = 6, 33000, 2
    w = torch.zeros(m, k)
    g = _gen(16)
    w[:, torch.randint(0, k, (40,), generator=g)] = torch.randn(m, 40, generator=g)
    w[:, -1] = 1.0
    A = st.CSR.from_dense(w)
    assert A.col.dtype == torch.int32
    x = torch.randn(n, k, generator=g)
    for c in (ROW, ELL, spmm_csr.Config("dense", 16, 16, 128, split_k=8)):
        _assert_spmm(_run_spmm(A, x, c), x, A, torch.float32)


def _ragged_csr(m, k, seed, dtype=torch.float32):
    """m rows of 0-59 nonzeros, one full row and one empty row: every band of the ell copy."""
    g = _gen(seed)
    lengths = torch.randint(0, 60, (m,), generator=g).clamp_(max=k)
    lengths[7], lengths[150 % m] = k, 0
    w = torch.zeros(m, k)
    for r, ln in enumerate(lengths.tolist()):
        w[r, torch.randperm(k, generator=g)[:ln]] = torch.randn(ln, generator=g)
    return st.CSR.from_dense(w.to(dtype))


def test_ell_copy_holds_the_matrix_in_eight_bands():
    from spartune.kernels._ell import ELL_BANDS, banded_ell
    A = _ragged_csr(300, 200, 21)
    E = banded_ell(A)
    starts, widths = (0,) + E.bands[:ELL_BANDS - 1], E.bands[ELL_BANDS - 1:]
    assert len(set(starts)) == ELL_BANDS and all(w % 16 == 0 for w in widths) and widths[0] >= 200
    assert list(widths) == sorted(widths, reverse=True)
    # scattered back, the copy is the matrix: every row's entries at its band position, then padding
    dense, at = torch.zeros(300, 201), 0
    for b in range(ELL_BANDS):
        end = starts[b + 1] if b + 1 < ELL_BANDS else 320
        for p in range(starts[b], end):
            seg = slice(at + (p - starts[b]) * widths[b], at + (p - starts[b] + 1) * widths[b])
            if p < 300:
                dense[int(E.rows[p]), E.cols[seg].long()] = E.values[seg]
            else:
                assert (E.cols[seg] == 200).all()
        at += (end - starts[b]) * widths[b]
    assert at == E.entries
    assert torch.equal(dense[:, :200], A.to_dense()) and (dense[:, 200] == 0).all()
    assert banded_ell(A) is E  # memoised
    A.values.mul_(2)  # an in-place update of the values: the copy follows
    assert banded_ell(A) is not E and torch.equal(banded_ell(A).values, 2 * E.values)


@pytest.mark.parametrize("n", [1, 6])
def test_spmm_ell_bands(n):
    """Every band in use, both kernels (n = 1: row, n > 1: row_t on the copy of x), x with NaN
    just past its last column (the padding's sentinel column must never be read) and spmm's
    token-adjacent layout."""
    m, k = 300, 200
    A = _ragged_csr(m, k, 21)
    g = _gen(22)
    big = torch.randn(n, k + 1, generator=g)
    big[:, k] = float("nan")
    x = big[:, :k]
    bias = torch.randn(m, generator=g)
    for c in (spmm_csr.Config("ell", 4, 1 if n == 1 else 8, 64), spmm_csr.Config("ell", 1, 8, 32)):
        _assert_spmm(_run_spmm(A, x, c, bias=bias), x, A, torch.float32, bias=bias)
        bigX = torch.randn(k + 1, n, generator=g)
        bigX[k] = float("nan")
        Y = torch.full((m, n), float("nan"))
        spmm_csr.launch(A, bigX[:k].T, Y.T, c)  # spmm(A, X) = launch(A, X.T, Y.T)
        assert not Y.isnan().any() and rel_err(Y, ref.spmm(A, bigX[:k])) <= 1e-5


def test_spmm_ell_rejects_blocks_across_bands():
    A = _ragged_csr(64, 50, 23)
    x = torch.randn(1, 50)
    with pytest.raises(ValueError, match="block_m must divide"):
        _run_spmm(A, x, spmm_csr.Config("ell", 64, 1, 64))


def test_spmm_split_workspace_is_left_clean():
    m, k, n = 40, 300, 5
    A = st.CSR.from_dense(_weight(m, k, 0.2, torch.float32, 17))
    for seed in (18, 19):
        x = torch.randn(n, k, generator=_gen(seed))
        _assert_spmm(_run_spmm(A, x, spmm_csr.Config("dense", 16, 16, 32, split_k=4)), x, A, torch.float32)
        for t in spmm_csr.dense._WORKSPACES[x.device]:
            assert int(t.count_nonzero()) == 0


def test_bitmap_matches_pattern():
    w = _weight(19, 70, 0.3, torch.float32, 20, "edges")
    A = st.CSR.from_dense(w)
    bits, woff = spmm_csr.csr_bitmap(A)
    assert spmm_csr.csr_bitmap(A)[0] is bits  # memoised
    u = bits.long() & 0xFFFFFFFF
    dense = ((u[:, :, None] >> torch.arange(32)) & 1).reshape(19, -1)[:, :70].bool()
    assert torch.equal(dense, w != 0)
    before = torch.cat([torch.zeros(19, 1, dtype=torch.long), torch.cumsum((w != 0).long(), 1)], 1)
    kw = woff.shape[1]
    assert torch.equal(woff.long(), A.crow[:-1, None].long() + before[:, 32 * torch.arange(kw)])


# ------------------------------------------------------------------------------------------
# SDDMM
# ------------------------------------------------------------------------------------------
def _assert_sddmm(vals, a, b, P, scale, dtype):
    assert not vals.isnan().any(), "a stored entry was not written"
    assert vals.shape == P.values.shape
    err = rel_err(P.with_values(vals.to(P.values.dtype) if vals.dtype != P.values.dtype else vals).to_dense(),
                  ref.sddmm(a, b, P, scale))
    assert err <= TOL[dtype], err


def _sddmm_cases():
    out = []
    A = st.CSR.from_dense(_weight(50, 60, 0.2, torch.float32, 21, "edges"))
    for c in sddmm.space(_problem("sddmm", "csr", A, 50, 60, 24, torch.float32)):
        out.append(pytest.param("csr", c, id=f"csr-{c.path}-{c.block_m}x{c.block_n}-d{c.block_d}-p{c.per_program}-w{c.num_warps}"))
    B = st.BlockSparse.from_dense(block_weight(50, 60, 16, 32, 0.5, gen=_gen(22)), (16, 32))
    for c in sddmm.space(_problem("sddmm", "block:16x32", B, 50, 60, 24, torch.float32)):
        out.append(pytest.param("block", c, id=f"block-p{c.per_program}-w{c.num_warps}"))
    return out


def _pattern(kind, m, n, dtype, seed, structure="edges", block=(16, 32)):
    if kind == "csr":
        return st.CSR.from_dense(_weight(m, n, 0.2, dtype, seed, structure))
    w = block_weight(m, n, *block, 0.5, gen=_gen(seed)).to(dtype)
    if structure == "edges":
        w[: block[0]] = 0  # an empty block-row
        w[-1] = 1.0  # a full (partial-edge) block-row
    elif structure == "empty":
        w.zero_()
    return st.BlockSparse.from_dense(w, block)


@pytest.mark.parametrize("kind,config", _sddmm_cases())
def test_sddmm_every_config(kind, config):
    m, n, d = 50, 60, 24
    P = _pattern(kind, m, n, torch.float32, 23)
    g = _gen(24)
    a, b = torch.randn(m, d, generator=g), torch.randn(n, d, generator=g)
    _assert_sddmm(sddmm.launch(a, b, P, config, scale=0.125), a, b, P, 0.125, torch.float32)


SD_GATHER = sddmm.Config("gather", 2, 16, 32)
SD_DENSE = sddmm.Config("dense", 32, 32, 32, per_program=2)
SD_BLOCK = sddmm.Config("block", 0, 0, 32, per_program=2)
SD_PATHS = [pytest.param("csr", SD_GATHER, id="gather"), pytest.param("csr", SD_DENSE, id="dense"),
            pytest.param("block", SD_BLOCK, id="block")]


@pytest.mark.parametrize("kind,config", SD_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d", [5, 40, 70])
def test_sddmm_dtypes_and_head_dims(kind, config, dtype, d):
    m, n = 33, 47
    P = _pattern(kind, m, n, dtype, 25)
    g = _gen(26)
    a, b = torch.randn(m, d, generator=g).to(dtype), torch.randn(n, d, generator=g).to(dtype)
    vals = sddmm.launch(a, b, P, config, scale=0.5)
    assert vals.dtype == dtype
    _assert_sddmm(vals, a, b, P, 0.5, dtype)


@pytest.mark.parametrize("kind,config", SD_PATHS)
@pytest.mark.parametrize("structure", ["random", "empty", "dense"])
def test_sddmm_structures_strides_out_dtype(kind, config, structure):
    m, n, d = 30, 41, 16
    P = _pattern(kind, m, n, torch.float16, 27, structure)
    g = _gen(28)
    a = torch.randn(d, m, generator=g).half().T  # transposed view
    b = torch.randn(n, 2 * d, generator=g).half()[:, ::2]  # strided view
    vals = sddmm.launch(a, b, P, config, scale=1.0, out_dtype=torch.float32)
    assert vals.dtype == torch.float32
    if P.values.numel():
        _assert_sddmm(vals.half(), a, b, P, 1.0, torch.float16)


def test_sddmm_block_padding_is_zero():
    m, n, d = 40, 50, 8
    P = st.BlockSparse.from_dense(torch.ones(m, n), (32, 32))
    g = _gen(29)
    a, b = torch.randn(m, d, generator=g), torch.randn(n, d, generator=g)
    vals = sddmm.launch(a, b, P, SD_BLOCK)
    P.with_values(vals)._validate()  # padding must stay zero for a valid format
    _assert_sddmm(vals, a, b, P, 1.0, torch.float32)


def test_sddmm_space_and_features():
    A = st.CSR.from_dense(_weight(64, 64, 0.05, torch.float32, 30))
    B = st.BlockSparse.from_dense(block_weight(64, 64, 64, 64, 0.5, gen=_gen(31)), 64)
    for P, fmt in ((A, "csr"), (B, "block:64x64")):
        for L, d in ((4096, 64), (8192, 128)):
            prob = Problem("sddmm", fmt, L, L, d, "float16", P.stats())
            space = sddmm.space(prob)
            assert 4 <= len(space) <= 40
            for c in space:
                _check_features(sddmm.features(prob, c))
    assert {c.path for c in sddmm.space(Problem("sddmm", "csr", 64, 64, 64, "float16", A.stats()))} == {"gather", "dense"}


# ------------------------------------------------------------------------------------------
# sparse softmax
# ------------------------------------------------------------------------------------------
def _assert_softmax(vals, P, scale, dtype):
    assert not vals.isnan().any()
    assert vals.shape == P.values.shape and vals.dtype == P.values.dtype
    err = rel_err(P.with_values(vals).to_dense(), ref.sparse_softmax(P, scale))
    assert err <= TOL[dtype], err


def _softmax_cases():
    out = []
    A = _pattern("csr", 40, 300, torch.float32, 32)
    for c in sparse_softmax.space(_problem("softmax", "csr", A, 40, 300, 0, torch.float32)):
        out.append(pytest.param("csr", c, id=f"csr-{c.block_m}x{c.block_n}"))
    out.append(pytest.param("csr", sparse_softmax.Config("row", 2, 32), id="csr-two-pass"))
    B = _pattern("block", 40, 300, torch.float32, 33)
    for c in sparse_softmax.space(_problem("softmax", "block:16x32", B, 40, 300, 0, torch.float32)):
        out.append(pytest.param("block", c, id=f"block-{c.block_m}"))
    return out


@pytest.mark.parametrize("kind,config", _softmax_cases())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_every_config(kind, config, dtype):
    P = _pattern(kind, 40, 300, dtype, 34)
    P = P.with_values(P.values * 4)  # wide logits: the max subtraction matters
    _assert_softmax(sparse_softmax.launch(P, config, scale=0.8), P, 0.8, dtype)


@pytest.mark.parametrize("kind", ["csr", "block"])
@pytest.mark.parametrize("structure", ["random", "empty", "dense"])
def test_softmax_structures(kind, structure):
    P = _pattern(kind, 21, 70, torch.float32, 35, structure)
    prob = _problem("softmax", "csr" if kind == "csr" else "block:16x32", P, 21, 70, 0, torch.float32)
    for c in sparse_softmax.space(prob)[:2]:
        vals = sparse_softmax.launch(P, c)
        if P.values.numel():
            _assert_softmax(vals, P, 1.0, torch.float32)


def test_softmax_large_logits_and_neg_inf():
    w = _weight(8, 40, 0.5, torch.float32, 36, "edges") * 1e4
    A = st.CSR.from_dense(w)
    vals = A.values.clone()
    row3 = slice(int(A.crow[3]), int(A.crow[4]))
    vals[row3] = float("-inf")  # a row of -inf logits gives zeros, not NaN
    A = A.with_values(vals)
    out = sparse_softmax.launch(A, sparse_softmax.Config("row", 2, 16))
    assert not out.isnan().any()
    assert bool((out[row3] == 0).all())
    _assert_softmax(out, A, 1.0, torch.float32)


def test_softmax_space_and_features():
    A = _pattern("csr", 64, 64, torch.float32, 37)
    B = _pattern("block", 64, 64, torch.float32, 38, block=(64, 64))
    for P, fmt in ((A, "csr"), (B, "block:64x64")):
        prob = Problem("softmax", fmt, 64, 64, 0, "float16", P.stats())
        space = sparse_softmax.space(prob)
        assert 1 <= len(space) <= 40
        for c in space:
            _check_features(sparse_softmax.features(prob, c))


# ------------------------------------------------------------------------------------------
# the expand path (densify + GEMM) and the token-last row_t kernel
# ------------------------------------------------------------------------------------------
def _expand_space_cases():
    A = st.CSR.from_dense(_weight(45, 70, 0.2, torch.float32, 0))
    out = []
    for dtype in (torch.float32, torch.float16):
        for c in spmm_csr.space(_problem("linear", "csr", A, 45, 70, 130, dtype)):
            if c.path == "expand":
                out.append(pytest.param(dtype, c, id=f"{DTYPES[dtype]}-{c.block_m}x{c.block_n}x{c.block_k}"))
    return out


@pytest.mark.parametrize("dtype,config", _expand_space_cases())
def test_spmm_expand_every_config(dtype, config):
    """Prefill sizes bring the expand path into the space; odd M, K, N against every tile."""
    m, k, n = 45, 70, 130
    A = st.CSR.from_dense(_weight(m, k, 0.2, dtype, 40, "edges"))
    g = _gen(41)
    x, bias, res = torch.randn(n, k, generator=g).to(dtype), torch.randn(m, generator=g).to(dtype), \
        torch.randn(n, m, generator=g).to(dtype)
    epi = dict(bias=bias, activation="gelu", residual=res, scale=0.5)
    _assert_spmm(_run_spmm(A, x, config, **epi), x, A, dtype, **epi)


def test_spmm_expand_workspace_reuse_across_shapes():
    """The dense workspace is shared: a larger then a smaller then a K-padded weight, each right."""
    for seed, (m, k) in enumerate(((70, 200), (20, 33), (33, 129), (70, 200))):
        for dtype in (torch.float32, torch.float16):
            A = st.CSR.from_dense(_weight(m, k, 0.3, dtype, 50 + seed, "edges"))
            x = torch.randn(9, k, generator=_gen(60 + seed)).to(dtype)
            _assert_spmm(_run_spmm(A, x, EXPAND), x, A, dtype)


@pytest.mark.parametrize("n", [2, 5, 16, 32, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_spmm_row_t_token_counts(n, dtype):
    """row_t's padded copy: N not a multiple of the strip or of 8, and N == strip (unmasked)."""
    m, k = 31, 90
    A = st.CSR.from_dense(_weight(m, k, 0.25, dtype, 70, "edges"))
    x = torch.randn(n, k, generator=_gen(71)).to(dtype)
    for c in (spmm_csr.Config("row_t", 2, 16, 64), spmm_csr.Config("row_t", 1, 32, 128),
              spmm_csr.Config("row_t", 4, 8, 32)):
        _assert_spmm(_run_spmm(A, x, c), x, A, dtype)
    # the same kernel on spmm's layout (tokens already adjacent, no copy, masked gather)
    X = torch.randn(k, n, generator=_gen(72)).to(dtype)
    Y = torch.full((m, n), float("nan"), dtype=dtype)
    spmm_csr.launch(A, X.T, Y.T, spmm_csr.Config("row", 2, 16, 64))
    assert not Y.isnan().any() and rel_err(Y, ref.spmm(A, X)) <= TOL[dtype]


def test_release_unused_drops_the_layouts_no_chosen_config_reads():
    """The tuner's measurements build the banded ELL copy and the bitmap; each stays only while a
    chosen config's path reads it (the bitmap was kept for good before session 31)."""
    from spartune.kernels._ell import banded_ell

    A = st.sparsify_weight(torch.randn(64, 96), "csr", 0.8)
    for keep_path, kept in (("ell", {"_spartune_banded_ell"}), ("dense", {"_spartune_csr_bitmap"}),
                            ("expand", {"_spartune_csr_bitmap"}), ("row", set())):
        banded_ell(A), spmm_csr.csr_bitmap(A)
        spmm_csr.release_unused(A, [spmm_csr.Config(keep_path, 16, 16, 32)])
        assert {k for k in ("_spartune_banded_ell", "_spartune_csr_bitmap") if k in A.__dict__} == kept, keep_path
