"""The csr_smem family's host side on the CPU: its sliced ELL layout (round trip, padding, the
bank rotation), its config space and features, and its validation."""
import dataclasses
import random

import pytest
import torch

import helpers
import spartune as st
from spartune.kernels import registry, spmm_csr_smem as K
from spartune.formats._base import stats_from_counts
from spartune.kernels._sliced_ell import sliced_ell, to_dense
from spartune.tune.problem import Problem, fp16_reduction_allowed


def random_csr(M, Kd, density, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(M, Kd, generator=g) * (torch.rand(M, Kd, generator=g) < density)).to(dtype)
    return w, st.CSR.from_dense(w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M, Kd, density", [(1, 5, 1.0), (100, 300, 0.1), (37, 1000, 0.5), (64, 64, 1.0),
                                            (300, 2500, 0.02), (50, 700, 0.0)])
@pytest.mark.parametrize("nt", [8, 16, 32])
@pytest.mark.parametrize("ks", [256, 1024])
@pytest.mark.parametrize("lanes", [1, 4])
def test_layout_round_trips(dtype, M, Kd, density, nt, ks, lanes):
    w, A = random_csr(M, Kd, density, dtype, seed=M + Kd + nt)
    team = nt // 8
    R, P = 32 // (team * lanes), 8 // team
    ell = sliced_ell(A, R, ks, P, lanes)
    assert ell.groups == -(-M // R) and ell.slices == -(-Kd // ks)
    assert torch.equal(to_dense(ell, (M, Kd), ks, dtype), w.double())
    sizes = ell.offsets[1:] - ell.offsets[:-1]
    assert (sizes % (4 * R * lanes) == 0).all()  # whole 16-byte loads for each of a row's lanes
    assert sorted(ell.rows[:M].tolist()) == list(range(M)) and (ell.rows[M:] == -1).all()
    # padding points at the zero rows past the slice
    local = (ell.words.long() & 0xFFFFFFFF) >> 16
    pad = local >= ks
    assert (local[pad] < ks + P).all()


def quarter_slots(ell, R, P):
    """(residue of each slot, is it padding), as (chunk and slot, quarter-warp, P rows)."""
    words = ell.words.long() & 0xFFFFFFFF
    local = (words >> 16).view(-1, R, 4).transpose(1, 2).reshape(-1, R // P, P)
    return local % P, ((words & 0xFFFF) == 0).view(-1, R, 4).transpose(1, 2).reshape(-1, R // P, P)


@pytest.mark.parametrize("R, P, ks, lanes, bound", [(32, 8, 4096, 1, 1.25), (16, 4, 4096, 1, 1.12),
                                                   (32, 8, 1024, 1, 1.10), (8, 8, 1024, 4, 1.12)])
def test_a_quarter_warp_mostly_reads_distinct_bank_positions(R, P, ks, lanes, bound):
    """Shared-memory wavefronts per quarter-warp and slot (the most rows of one residue) on a 90%
    weight: 1.18 / 1.08 / 1.09 / 1.09, where v14's order (every later slot of a row shifted once a
    residue class ran out) had 1.38 / 1.15 / 1.73 for the first three."""
    _, A = random_csr(2048, 4096, 0.1, seed=1)
    residue, _ = quarter_slots(sliced_ell(A, R, ks, P, lanes), R, P)
    wavefronts = torch.nn.functional.one_hot(residue, P).sum(2).amax(2).double().mean()
    assert 1.0 <= wavefronts < bound


def test_padding_takes_the_residues_its_quarter_warp_leaves_free():
    _, A = random_csr(300, 2500, 0.05, seed=2)
    R, P = 32, 8
    residue, pad = quarter_slots(sliced_ell(A, R, 1024, P), R, P)
    real = torch.nn.functional.one_hot(residue, P) * (~pad).unsqueeze(-1)
    taken = real.sum(2) > 0  # residues real columns read
    distinct = taken.sum(2)
    clash = (pad & torch.gather(taken, 2, residue)).any(2)  # a padding row on a real column's residue
    assert pad.any() and not (clash & (distinct + pad.sum(2) <= P)).any()
    # and padding rows never share a residue among themselves while one is free
    pads = torch.nn.functional.one_hot(residue, P) * pad.unsqueeze(-1)
    assert not ((pads.sum(2) > 1).any(2) & (distinct + pad.sum(2) <= P)).any()


def test_the_layout_is_rebuilt_when_values_change():
    w, A = random_csr(40, 300, 0.2)
    first = sliced_ell(A, 16, 256, 4)
    assert sliced_ell(A, 16, 256, 4) is first
    A.values.mul_(2)
    again = sliced_ell(A, 16, 256, 4)
    assert torch.equal(to_dense(again, (40, 300), 256, torch.float16), 2 * w.double())
    K.release_unused(A, [K.Config(16, 256, 4)])
    assert "_sliced_ell_16_256_4_1" in A.__dict__
    K.release_unused(A, [])
    assert not any(k.startswith("_sliced_ell_") for k in A.__dict__)


def test_layout_refuses_fp32_weights():
    _, A = random_csr(8, 16, 0.5, torch.float32)
    with pytest.raises(TypeError, match="fp16 / bf16"):
        sliced_ell(A, 32, 256, 8)


def problem(M, Kd, N, density=0.1, dtype="float16", device="NVIDIA H100 80GB HBM3 sm_90"):
    _, A = random_csr(M, Kd, density)
    return Problem("linear", "csr", M, Kd, N, dtype, A.stats(), device=device)


@pytest.mark.parametrize("N, nt", [(1, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32), (33, 32), (64, 32)])
def test_space_token_tile(N, nt):
    prob = problem(256, 4096, N)
    configs = K.space(prob)
    assert configs and {c.nt for c in configs} == {nt}
    for c in configs:
        assert K._smem_bytes(c) <= K.SMEM_LIMIT
        f = K.features(prob, c)
        assert f.programs > 0 and f.dram_bytes > 0 and f.fma_flops > 0
        assert f.split_k == -(-4096 // c.ks)


@pytest.mark.parametrize("nt, tpl", [(8, 8), (16, 8), (32, 8), (16, 16), (32, 16)])
@pytest.mark.parametrize("qs", [1, 2, 4])
def test_plane_pitch_puts_a_quarter_warp_on_distinct_bank_positions(nt, tpl, qs):
    """The kernel's lanes (lane = q * QLANES + t * TEAM + h) in each quarter-warp: their rows t read
    columns distinct mod P (the copy's order), lane h its planes tpl / 8 * h + j at the plane pitch:
    every 16-byte load of x lands on 8 distinct bank positions."""
    cfg = K.Config(nt, 1024, 8, qs=qs, tpl=tpl)
    team, R, P = K._team(cfg)
    qlanes, pitch = R * team, K._plane_rows(cfg)
    rng = random.Random(nt + tpl + qs)
    for _ in range(20):
        residue = rng.sample(range(P), P)  # the copy: rows t = iP .. iP + P - 1 in distinct residues
        col = {(q, t): residue[t % P] + P * rng.randrange(1024 // P) for q in range(qs) for t in range(R)}
        for quarter in range(4):
            for j in range(tpl // 8):  # a lane's j-th load of a word
                banks = set()
                for lane in range(8 * quarter, 8 * quarter + 8):
                    q, t, h = lane // qlanes, lane % qlanes // team, lane % team
                    banks.add((col[q, t] + (tpl // 8 * h + j) * pitch) % 8)
                assert len(banks) == 8, (quarter, j)


def rows_copy_bytes(c) -> int:
    """The CTA's output rows, copied on chip where it holds up to ROWS_COPY_MAX team rows."""
    team_rows = c.warps // c.kw * c.gpw * K._team(c)[1]
    return team_rows * 4 if team_rows <= K.ROWS_COPY_MAX else 0


def test_space_offers_sixteen_tokens_a_lane_from_sixteen_tokens():
    """tpl = 16 beside the configs at nt >= 16 where the arithmetic outweighs x's staging: the
    same rows per warp as nt = 8 (one lane a row at nt = 16), fewer instructions per product,
    x's planes and 16 sums a warp's lane."""
    assert {c.tpl for c in K.space(problem(8192, 1024, 8, 0.3))} == {8}
    # (qkv at 90%: 3 nonzeros per SM and column of x, staging dominates: not offered)
    assert {c.tpl for c in K.space(problem(4096, 4096, 16))} == {8}
    prob = problem(8192, 1024, 16, 0.3)  # 18.6 per SM and column
    configs = K.space(prob)
    sixteen = [c for c in configs if c.tpl == 16]
    # (twins whose CTAs would hold half the rows' sums or fill too few SMs are left out)
    assert len(sixteen) > len(configs) / 3 and {dataclasses.replace(c, tpl=8) for c in sixteen} <= set(configs)
    for c in sixteen:
        eight = dataclasses.replace(c, tpl=8)
        assert K._team(c)[1] == 32 // c.qs == 2 * K._team(eight)[1]
        f, g = K.features(prob, c), K.features(prob, eight)
        assert f.fma_flops < g.fma_flops and f.programs * 2 >= g.programs
        if c.ck == 1:  # x's two planes of ks + 8 rows, 16 sums a lane where warps share groups, the rows
            assert K._smem_bytes(c) == (c.ks + 8) * 16 * 2 + (c.warps * 32 * 16 * 4 if c.kw > 1 else 0) \
                + rows_copy_bytes(c)
    assert K._plane_rows(K.Config(32, 1024, 8, tpl=16)) == 1024 + 4 + 2


def test_space_shares_groups_between_warps_with_room_for_their_sums():
    """kw > 1: every kw divides its CTA's warps, shared memory holds x's slice and each warp's
    sums, and each warp's steps shrink kw-fold while the CTA holds warps / kw rows of warps."""
    prob = problem(4096, 4096, 8)
    configs = K.space(prob)
    shared = [c for c in configs if c.kw > 1 and c.ck == 1]
    assert {c.kw for c in shared} == set(K.WARPS_PER_GROUP)
    for c in shared:
        assert c.warps % c.kw == 0 and c.qs == 1
        assert K._smem_bytes(c) == (c.ks + 8) * 8 * 2 + c.warps * 1024 + rows_copy_bytes(c) <= K.SMEM_LIMIT
        alone = K.Config(c.nt, c.ks, c.warps // c.kw, c.gpw, 1)
        assert K.features(prob, c).programs == K.features(prob, alone).programs
        assert K.features(prob, c).steps_mean == pytest.approx(K.features(prob, alone).steps_mean / c.kw)
    # a slice of 8192 columns at 32 tokens (512 KB) does not fit, with or without sums
    assert not [c for c in K.space(problem(256, 16384, 32)) if c.ks == 8192]


def test_clusters_hold_a_row_blocks_slices_on_hopper_only():
    """ck > 1: exactly the K slices of a row block (2..8), Hopper only; shared memory gains the
    CTA's fp32 sums; the partials are read once from the peers instead of written and read back
    through global memory (the barrier stands in the fix-up's place); x's copies through L2
    shrink with the slice."""
    prob = problem(4096, 4096, 16)
    configs = K.space(prob)
    clustered = [c for c in configs if c.ck > 1]
    assert {c.ks for c in clustered} == {512, 1024, 2048}
    for c in clustered:
        assert c.ck == 4096 // c.ks
        plain = K.Config(c.nt, c.ks, c.warps, c.gpw, c.qs, c.kw, tpl=c.tpl)
        assert plain in configs
        rows = c.warps // c.kw * c.gpw * K._team(c)[1]
        assert K._smem_bytes(c) == K._smem_bytes(plain) + rows * 16 * 4
        f, g = K.features(prob, c), K.features(prob, plain)
        assert f.split_k == g.split_k == c.ck and 0 < f.reduce_bytes == g.reduce_bytes / 2
        assert f.cluster == c.ck and g.cluster == 1  # the model fills a wave with whole clusters
        assert f.l2_bytes == g.l2_bytes
    whole = [c for c in configs if c.ks == 4096 and c.kw == 8 and c.gpw == 1 and c.warps == 16][0]
    split = [c for c in clustered if c.ks == 512 and c.kw == 1 and c.gpw == 1 and c.warps == 8][0]
    assert K.features(prob, split).l2_bytes < K.features(prob, whole).l2_bytes
    assert not [c for c in K.space(problem(4096, 4096, 16, device="NVIDIA A100 sm_80")) if c.ck > 1]
    assert not [c for c in K.space(problem(256, 16384, 16)) if c.ks < 2048 and c.ck > 1]  # > 8 slices


def test_launch_refuses_a_cluster_that_is_not_the_slices():
    _, A = random_csr(8, 1000, 0.5)
    x = torch.randn(2, 1000, dtype=torch.float16)
    out = torch.empty(2, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="exactly 4 of 256"):
        K.launch(A, x, out, K.Config(8, 256, 4, ck=2))
    assert not any(k.startswith("_sliced_ell_") for k in A.__dict__)


def test_space_is_empty_where_the_family_does_not_run():
    assert K.space(problem(256, 4096, 8, dtype="float32")) == []
    assert K.space(problem(256, 4096, 2048, density=0.2)) == []  # wide N: only very sparse weights
    assert K.space(problem(256, 4096, 2048, density=0.02))
    assert K.space(Problem("linear", "2:4", 256, 4096, 8, "float16", problem(256, 4096, 8).stats)) == []


def test_registered_and_unavailable_without_a_gpu():
    fam = registry.by_name("csr_smem")
    assert fam is not None and fam.language == "cuda" and fam.serves(random_csr(4, 8, 0.5)[1])
    if not torch.cuda.is_available():
        assert not fam.available(torch.device("cpu"))
        assert not K.available(torch.device("cpu"))


def test_launch_refuses_mismatched_dtypes_before_any_kernel():
    _, A = random_csr(8, 16, 0.5)
    x = torch.randn(2, 16)
    out = torch.empty(2, 8, dtype=torch.float16)
    with pytest.raises(TypeError, match="x must be"):
        K.launch(A, x, out, K.Config(8, 256, 4))
    _, A32 = random_csr(8, 16, 0.5, torch.float32)
    with pytest.raises(TypeError, match="fp16 / bf16"):
        K.launch(A32, x, out, K.Config(8, 256, 4))


def test_launch_refuses_bad_shapes_and_dtypes_before_any_layout_is_built():
    _, A = random_csr(8, 16, 0.5)
    x = torch.randn(2, 16, dtype=torch.float16)
    out = torch.empty(2, 8, dtype=torch.float16)
    cfg = K.Config(8, 256, 4)
    bad = [(dict(x=torch.randn(2, 15, dtype=torch.float16)), ValueError, "x must be"),
           (dict(out=torch.empty(3, 8, dtype=torch.float16)), ValueError, "out"),
           (dict(bias=torch.randn(7, dtype=torch.float16)), ValueError, "bias"),
           (dict(bias=torch.randn(16, dtype=torch.float16)[::2]), ValueError, "contiguous"),
           (dict(residual=torch.randn(2, 9, dtype=torch.float16)), ValueError, "residual"),
           (dict(out=torch.empty(2, 8, dtype=torch.float64)), TypeError, "fp32")]
    for change, err, match in bad:
        args = dict(x=x, out=out, bias=None, residual=None) | change
        with pytest.raises(err, match=match):
            K.launch(A, args["x"], args["out"], cfg, bias=args["bias"], residual=args["residual"])
    assert not any(k.startswith("_sliced_ell_") for k in A.__dict__)


def test_space_caps_split_k_partials_and_token_tiles():
    # 16384 columns need two slices at least, whose partials would be 1 GiB at 8192 tokens; on
    # Hopper a cluster's slices sum on chip instead
    rows = torch.full((16384,), 328)  # 2%: a random matrix this size takes seconds to draw on the CPU
    big = Problem("linear", "csr", 16384, 16384, 8192, "float16",
                  stats_from_counts(16384, 16384, int(rows.sum()), 1, 1, rows), device="NVIDIA H100 80GB HBM3 sm_90")
    assert K.space(dataclasses.replace(big, device="NVIDIA A100 sm_80")) == []
    hopper = K.space(big)
    assert hopper and all(c.ck > 1 for c in hopper)
    wide = problem(4096, 4096, 2048, density=0.02)
    assert K.space(wide) and all(K._partials_bytes(wide, c) <= K.MAX_PARTIALS_BYTES for c in K.space(wide))
    assert K.space(problem(64, 256, 32 * (K.MAX_TOKEN_TILES + 1), density=0.02)) == []


def test_outgrown_buffers_stay_alive_for_captured_graphs():
    from spartune.kernels import _common

    cache = {}
    first = _common.grown(cache, "k", 10, lambda n: torch.zeros(n))
    assert _common.grown(cache, "k", 8, lambda n: torch.zeros(n)) is first
    second = _common.grown(cache, "k", 11, lambda n: torch.zeros(n))
    assert second.numel() >= 20 and any(b is first for b in _common.RETIRED)


def test_config_refuses_tokens_per_lane_its_tile_cannot_hold():
    with pytest.raises(TypeError, match="tokens per lane"):
        K.Config(8, 256, 4, tpl=16)
    with pytest.raises(TypeError, match="tokens per lane"):
        K.Config(32, 256, 4, tpl=32)


def test_space_of_a_weight_without_columns():
    """K = 0 (an (M, 0) weight): one slice width, no even cut to divide by zero slices."""
    empty = st.CSR.from_dense(torch.zeros(64, 0, dtype=torch.float16))
    prob = Problem("linear", "csr", 64, 0, 8, "float16", empty.stats(), device="NVIDIA H100 80GB HBM3 sm_90")
    assert {c.ks for c in K.space(prob)} == {K.K_SLICES[0]}


@pytest.mark.parametrize("Kd", [11008, 13824, 4096, 3000])
def test_space_cuts_k_evenly_where_its_widths_leave_a_short_last_slice(Kd):
    """Beside each power-of-two width, K cut into as many slices of equal width (a multiple of 32):
    11008 = 4096 + 4096 + 2816 also runs as 3 x 3680; a K the widths divide gets no extra width."""
    widths = {c.ks for c in K.space(problem(256, Kd, 8, density=0.1))}
    assert all(ks % 32 == 0 for ks in widths)
    for ks in K.K_SLICES:
        if ks in widths and Kd > ks:
            slices = -(-Kd // ks)
            even = 32 * -(-Kd // (32 * slices))
            assert even in widths, (ks, even)  # (ks itself where it divides K)
            assert -(-Kd // even) == slices and even * slices - Kd < 32 * slices
    extra = widths - set(K.K_SLICES)
    assert sorted(extra) == {11008: [1856, 3680, 5504], 13824: [992, 1984, 3456, 6912], 4096: [], 3000: [1504]}[Kd]


def test_fp16_sums_in_half_pairs_only_where_torch_allows_reduced_precision():
    """HALF_SUMS follows the problem's fp16 reduced-precision flag (torch's, read when the problem is
    made) from 16 tokens a CTA, and never applies to bf16; the model prices the lighter loop."""
    cfg = K.Config(16, 1024, 8)
    stats = st.CSR.from_dense(torch.eye(256, 1024)).stats()

    def prob(dtype="float16", n=16, reduced=True):
        return Problem("linear", "csr", 256, 1024, n, dtype, stats, fp16_reduction=reduced)

    def half(problem, config):
        (inst,) = K.instances(problem, config)
        return dict(inst.defines).get("HALF_SUMS") == 1

    assert half(prob(), cfg)
    assert not half(prob(n=8), K.Config(8, 1024, 8))
    assert not half(prob("bfloat16", reduced=False), cfg)
    assert not half(prob(reduced=False), cfg)
    light = K.features(prob(), cfg).fma_flops
    assert light == pytest.approx(K.HALF_SUMS_ISSUE * K.features(prob(reduced=False), cfg).fma_flops)
    for allowed in (True, False):  # what a launch reads
        with helpers.fp16_reduced_precision(allowed):
            assert K.half_sums(cfg, fp16_reduction_allowed(torch.float16)) is allowed
            assert not K.half_sums(cfg, fp16_reduction_allowed(torch.bfloat16))
