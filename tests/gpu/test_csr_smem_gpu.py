"""The CSR decode family on CUDA cores (x in shared memory) on the GPU: every config, odd
shapes, empty rows, a full row, every epilogue, strided operands, split K, CUDA graphs and
spartune.linear, against the float64 reference; every output element written."""
import dataclasses

import pytest
import torch

import helpers
import spartune as st
from spartune.kernels import spmm_csr_smem as K
from spartune.tune.device import device_name
from spartune.tune.problem import Problem

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
TOL = 1e-2
ACTS = helpers.ACTS


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(private_cache):
    K._kernels.clear()
    yield
    K._kernels.clear()


def random_csr(M, Kd, density, dtype, seed, empty_rows=(), full_rows=()):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(M, Kd, generator=g) * (torch.rand(M, Kd, generator=g) < density)
    for r in empty_rows:
        w[r] = 0
    for r in full_rows:
        w[r] = torch.randn(Kd, generator=g)
    w = w.to(dtype).cuda()
    return w, st.CSR.from_dense(w)


reference = helpers.linear_reference
rel = helpers.rel_err


def configs(A, n):
    prob = Problem("linear", "csr", *A.shape, n, str(A.dtype).split(".")[-1], A.stats(), device=device_name())
    found = K.space(prob)
    assert found, prob
    return found


def run(A, x, config, out=None, **epi):
    if out is None:
        out = torch.full((x.shape[0], A.shape[0]), float("nan"), device="cuda", dtype=x.dtype)
    K.launch(A, x, out, config, **epi)
    return out


def check(A, w, x, cfg, **epi):
    out = run(A, x, cfg, **epi)
    assert not out.isnan().any(), cfg
    assert rel(out, reference(x, w, **epi)) <= TOL, cfg


# bf16 differs from fp16 only in how a 16-bit value becomes a float: every template parameter
# under bf16 at one token tile, under fp16 at each (each compile costs ~1 s on the device host)
@pytest.mark.parametrize("dtype, N", [(torch.float16, 1), (torch.float16, 16), (torch.float16, 32),
                                      (torch.bfloat16, 16)])
def test_across_the_space(dtype, N):
    """Every (lanes per row, groups per warp, warps) at one slice width, every slice width at
    one lane and group, every (warps per group, warps, groups) with K whole and one with K split:
    each template parameter in every value it takes."""
    w, A = random_csr(300, 3000, 0.1, dtype, N)
    x = torch.randn(N, 3000, device="cuda", dtype=dtype)
    space = [c for c in configs(A, N) if c.ck == 1]  # (clusters: their own test)
    chosen = [c for c in space if c.kw == 1 and (c.ks == 1024 or (c.qs == 1 and c.gpw == 1))]
    assert {c.qs for c in chosen} == set(K.LANES_PER_ROW) and len({c.ks for c in chosen}) >= 3
    chosen += [K.Config(c.nt, c.ks, c.warps, c.gpw, 4) for c in chosen if c.qs == 2]  # the kernel's QS = 4
    widest = max(c.ks for c in space if c.kw > 1)  # K whole where it fits
    shared = [c for c in space if c.kw > 1 and c.ks == widest and c.gpw <= 2]
    assert {c.kw for c in shared} == set(K.WARPS_PER_GROUP)
    chosen += shared + [c for c in space if c.kw == 8 and c.ks == 1024 and c.warps == 16][:2]
    for cfg in chosen:
        check(A, w, x, cfg)


@pytest.mark.parametrize("dtype, N", [(torch.float16, 7), (torch.float16, 16), (torch.float16, 33),
                                      (torch.bfloat16, 16)])
def test_clusters_of_a_row_blocks_slices(dtype, N):
    """ck > 1 (sm_90): every cluster size the space offers here (2, 3, 4, 6, 8 slices), each
    kind of CTA (lanes per row, the most groups per warp, warps sharing a group, 28 warps), a K tail, rows past M,
    tokens past N, and the whole epilogue on one config of each size."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("clusters run on sm_90")
    seen = set()
    for Kd in (3000, 3900):
        w, A = random_csr(1000, Kd, 0.1, dtype, Kd + N)
        x = torch.randn(N, Kd, device="cuda", dtype=dtype)
        clustered = [c for c in configs(A, N) if c.ck > 1]
        for ck in sorted({c.ck for c in clustered}):
            mine = [c for c in clustered if c.ck == ck]
            plain = next(c for c in mine if c.kw == 1 and c.qs == 1 and c.gpw == 1)
            picks = {plain, next(c for c in mine if c.qs == 2), max(mine, key=lambda c: c.gpw),
                     next(c for c in mine if c.kw > 1), K.Config(plain.nt, plain.ks, plain.warps, qs=4, ck=ck),
                     next(c for c in mine if c.warps == 28)}  # 7 rows of warps
            for cfg in picks:  # element by element: a wrong row must not hide in the norm
                out = run(A, x, cfg)
                ref = reference(x, w)
                torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=1e-2 * ref.abs().max().item(),
                                           msg=str(cfg))
            bias = torch.randn(1000, device="cuda", dtype=dtype)
            res = torch.randn(N, 1000, device="cuda", dtype=dtype)
            check(A, w, x, mine[-1], bias=bias, residual=res, activation="gelu", scale=0.5)
            seen.add(ck)
    assert seen == {2, 3, 4, 6, 8}


@pytest.mark.parametrize("dtype, N", [(torch.float16, 9), (torch.float16, 16), (torch.float16, 33),
                                      (torch.bfloat16, 16), (torch.bfloat16, 32)])
def test_sixteen_tokens_a_lane(dtype, N):
    """tpl = 16: each kind of CTA (lanes per row, groups per warp, warps sharing a group, split K
    through global partials, a cluster where sm_90 has them), a K tail, rows past M and tokens past
    N, element by element; the whole epilogue on one."""
    M, Kd = 3000, 1900  # dense enough per SM for the space to offer tpl = 16
    w, A = random_csr(M, Kd, 0.9, dtype, N + 16)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    mine = [c for c in configs(A, N) if c.tpl == 16]
    picks = {next(c for c in mine if c.kw == 1 and c.ck == 1 and c.ks == 1024),  # partials
             next(c for c in mine if c.qs == 2), max(mine, key=lambda c: (c.gpw, c.ks)),
             max((c for c in mine if c.kw > 1), key=lambda c: (c.kw, c.ks)),
             *[c for c in mine if c.ck > 1][:1]}
    ref = reference(x, w)
    for cfg in picks:
        out = run(A, x, cfg)
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=1e-2 * ref.abs().max().item(), msg=str(cfg))
    bias = torch.randn(M, device="cuda", dtype=dtype)
    res = torch.randn(N, M, device="cuda", dtype=dtype)
    check(A, w, x, min(picks, key=lambda c: c.ks), bias=bias, residual=res, activation="gelu", scale=0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, Kd", [(1, 5), (17, 33), (100, 300), (1000, 777), (4096, 4096)])
@pytest.mark.parametrize("N", [1, 7, 33, 77])
def test_odd_shapes(dtype, M, Kd, N):
    density = 0.2 if N <= K.WIDE_N else 0.05  # past WIDE_N tokens the family takes very sparse weights only
    w, A = random_csr(M, Kd, density, dtype, M + Kd + N)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    if N > K.WIDE_N and A.stats().density > K.WIDE_MAX_DENSITY:  # a tiny matrix drew a denser mask
        assert K.space(Problem("linear", "csr", M, Kd, N, str(dtype).split(".")[-1], A.stats())) == []
        return
    found = configs(A, N)
    for cfg in {found[0], found[-1]}:
        check(A, w, x, cfg)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_rows_a_full_row_and_an_empty_matrix(dtype):
    w, A = random_csr(200, 1500, 0.05, dtype, 3, empty_rows=range(0, 200, 7), full_rows=(5, 150))
    x = torch.randn(9, 1500, device="cuda", dtype=dtype)
    bias = torch.randn(200, device="cuda", dtype=dtype)
    for cfg in configs(A, 9):
        check(A, w, x, cfg, bias=bias)  # empty rows get act(bias)
    w0, A0 = random_csr(64, 256, 0.0, dtype, 4)
    check(A0, w0, x[:, :256], configs(A0, 9)[0], bias=bias[:64])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", list(ACTS))
@pytest.mark.parametrize("out_dtype", ["same", torch.float32])
def test_every_epilogue(dtype, activation, out_dtype):
    M, Kd, N = 260, 2100, 12
    w, A = random_csr(M, Kd, 0.1, dtype, 13)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    bias = torch.randn(M, device="cuda", dtype=dtype)
    res = torch.randn(N, M, device="cuda", dtype=dtype)
    odt = dtype if out_dtype == "same" else out_dtype
    found = configs(A, N)
    for cfg in (found[0], found[-1]):  # split K and one slice
        for kw in (dict(bias=bias), dict(residual=res), dict(bias=bias, residual=res, scale=0.5), {}):
            out = torch.full((N, M), float("nan"), device="cuda", dtype=odt)
            run(A, x, cfg, out=out, activation=activation, **kw)
            assert not out.isnan().any()
            assert rel(out, reference(x, w, activation=activation, **kw)) <= TOL, (cfg, kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [1, 7, 40])
def test_strided_x_and_out(dtype, N):
    M, Kd = 200, 520
    w, A = random_csr(M, Kd, 0.15, dtype, 4)
    # x views: spmm's X.T (tokens contiguous), then an odd row pitch and offset
    helpers.check_strided_operands(run, A, w, configs(A, N), N, dtype, x_view=lambda t, k: t[:, 1:k + 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Kd, offset, mode", [(519, 2, 1), (520, 2, 1), (517, 8, 2), (520, 0, 2), (1021, 8, 2)])
def test_x_staged_by_rows_from_a_padded_pitch(dtype, Kd, offset, mode):
    """The stmatrix staging reads x's rows at their own pitch and stops at K (a tail shorter than
    a load included); past N its tokens are zeros. Mode 1: 4-byte column pairs (a 4-byte aligned
    start); mode 2: 8 columns a load (pitch and start 16-byte aligned)."""
    M, N = 150, 13
    w, A = random_csr(M, Kd, 0.15, dtype, Kd)
    pitch = (Kd + 8 + 7) // 8 * 8 + (0 if mode == 2 else 2)
    x = torch.randn(N, pitch + offset, device="cuda", dtype=dtype)[:, offset:offset + Kd]
    assert K._x_rows(x) == mode
    found = configs(A, N)
    for cfg in {found[0], found[-1], *[c for c in found if c.kw == 32][:1]}:
        check(A, w, x, cfg)


@pytest.mark.parametrize("N, tpl", [(16, 8), (16, 16), (33, 8), (33, 16)])
def test_fp16_sums_in_half_pairs_and_in_fp32(N, tpl):
    """fp16 at 16 tokens a CTA or more, with torch's reduced-precision reductions allowed (the
    default), sums each chunk's products in fp16 pairs, without them in fp32: both right on long
    rows (K = 4096 at 20%, the widest slices, 1024-column ones, a cluster), two kernels, and the half
    sums within 4x the fp32 sums' error."""
    w, A = random_csr(600, 4096, 0.2, torch.float16, N)
    x = torch.randn(N, 4096, device="cuda", dtype=torch.float16)
    ref = reference(x, w)
    tiled = [dataclasses.replace(c, tpl=tpl) for c in configs(A, N) if c.tpl == 8]  # (tpl 16 off the gate here)
    tiled = [c for c in tiled if K._smem_bytes(c) <= K.SMEM_LIMIT]
    widest = max(c.ks for c in tiled if c.ck == 1)
    cfgs = ([c for c in tiled if c.ks == widest and c.ck == 1][:2] + [c for c in tiled if c.ks == 1024 and c.ck == 1][:2]
            + [c for c in tiled if c.ck > 1][:1])
    assert len(cfgs) == 5
    for cfg in cfgs:
        errs = []
        for allowed in (True, False):
            with helpers.fp16_reduced_precision(allowed):
                out = run(A, x, cfg)
            assert not out.isnan().any(), (cfg, allowed)
            errs.append(rel(out, ref))
        assert max(errs) <= TOL and errs[0] <= 4 * errs[1], (cfg, errs)
        assert errs[0] != errs[1], cfg  # two kernels, two ways of summing
        index = torch.cuda.current_device()
        assert (cfg, torch.float16, index, True) in K._kernels and (cfg, torch.float16, index, False) in K._kernels


def test_inf_in_x_stays_in_its_rows():
    """Padding reads zero rows of the staged x, never a real column: an inf in x reaches only
    the rows that store its column."""
    w, A = random_csr(64, 512, 0.05, torch.float16, 8)
    x = torch.randn(3, 512, device="cuda", dtype=torch.float16)
    x[1, 0] = float("inf")
    for cfg in configs(A, 3):
        out = run(A, x, cfg)
        hit = w[:, 0] != 0
        assert torch.isfinite(out[:, ~hit]).all(), cfg
        assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_graph_capture(dtype):
    M, Kd, N = 1024, 4096, 16
    w, A = random_csr(M, Kd, 0.1, dtype, 5)
    x = torch.randn(N, Kd, device="cuda", dtype=dtype)
    out = torch.empty(N, M, device="cuda", dtype=dtype)
    found = configs(A, N)
    split = min((c for c in found if c.ck == 1), key=lambda c: (c.ks, -c.qs))  # partials, arrival counters
    clustered = [c for c in found if c.ck > 1][:1]  # (sm_90)
    for cfg in [split, *clustered]:
        run(A, x, cfg, out=out)
        graph = helpers.capture(lambda: K.launch(A, x, out, cfg))
        for _ in range(3):  # replays leave the counters at zero
            out.fill_(float("nan"))
            x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            assert rel(out, reference(x, w)) <= TOL, cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [1, 8, 32])
def test_through_spartune_linear(dtype, N):
    w, A = random_csr(2048, 2048, 0.1, dtype, 6)
    x = torch.randn(N, 2048, device="cuda", dtype=dtype)
    bias = torch.randn(2048, device="cuda", dtype=dtype)
    for _ in range(2):  # tuned, then the cached choice
        y = st.linear(x, A, bias, "silu")
        assert rel(y, reference(x, w, bias, "silu")) <= TOL


def test_a_bound_launch_writes_each_calls_tensors():
    """A bound launch given new x and out while the first call's out is still held (each split
    K slice's workspace made per call): each call reads its own x and writes its own out."""
    M, Kd, N = 512, 4096, 8
    w, A = random_csr(M, Kd, 0.1, torch.float16, 33)
    for cfg in (c for c in configs(A, N) if c.ks < Kd and c.ck == 1):
        helpers.check_bound_launch_with_outputs_held(K.bind, A, w, cfg, N, TOL)
        break
    else:
        pytest.skip("no config slices K here")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotated_timings_of_our_config_and_dense(dtype):
    """The tuner's rotated timing (our best against dense at a margin): both run on fresh copies
    of the weight, time something, ours writes the right output, and no copy stays behind."""
    from spartune import dispatch

    w, A = random_csr(4096, 4096, 0.1, dtype, 41)
    x = torch.randn(32, 4096, device="cuda", dtype=dtype)
    bias = torch.randn(4096, device="cuda", dtype=dtype)
    timer = dispatch.rotated_timer(A, x, out := torch.empty(32, 4096, device="cuda", dtype=dtype), bias, "relu")
    prob = dispatch.linear_problem(A, 32, str(dtype).split(".")[-1])
    cfg = configs(A, 32)[0]
    for backend, config, nbytes in (("dense", None, 4096 * 4096 * 2), ("csr_smem", cfg, K.features(prob, cfg).dram_bytes)):
        timer(backend, config, nbytes)  # A's own memos (dense's copy) and cuBLAS's workspace stay
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out.fill_(float("nan"))
        seconds = timer(backend, config, nbytes)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() - before < 4 << 20, backend  # the copies and their layouts are gone
        assert 1e-7 < seconds < 1e-3, (backend, seconds)
        if backend == "csr_smem":  # (dense returns cuBLAS's own output)
            assert not out.isnan().any() and rel(out, reference(x, w, bias, "relu")) <= TOL
    with pytest.raises(RuntimeError, match="copies"):  # a tiny weight would need too many copies
        timer("dense", None, 4096)
