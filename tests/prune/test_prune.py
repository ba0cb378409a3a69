"""Magnitude pruning into each pattern."""
import pytest
import torch

import spartune as st
from spartune.prune import shuffle_rows, sparsify_weight


def low_rank_plus_noise(rows, cols, rank=8, noise=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, rank, generator=g) @ torch.randn(rank, cols, generator=g) / rank**0.5 + noise * torch.randn(rows, cols, generator=g)


@pytest.mark.parametrize("pattern, sparsity, fmt_type", [
    ("csr", 0.9, st.CSR),
    ("block:32", 0.8, st.BlockSparse),
    ("block:16x64", 0.5, st.BlockSparse),
    ("shfl:32", 0.9, st.ShuffledBlock),
    ("2:4", None, st.NM),
    ("1:4", 0.75, st.NM),
    ("32:2:8", None, st.VNM),
])
def test_pruning_hits_the_sparsity_and_keeps_values(pattern, sparsity, fmt_type):
    w = torch.randn(100, 200)
    before = w.clone()
    fmt, report = st.sparsify_weight(w, pattern, sparsity, return_report=True)
    assert isinstance(fmt, fmt_type)
    assert torch.equal(w, before), "the user's weight must not change"
    dense = fmt.to_dense()
    kept = dense != 0
    assert torch.equal(dense[kept], w[kept]), "kept entries keep their value"
    target = sparsity if sparsity is not None else 1 - st.parse_pattern(pattern).fixed_density
    assert report.sparsity == pytest.approx(target, abs=0.03)
    assert report.retained == pytest.approx((dense.double().norm() / w.double().norm()).item())


def test_csr_keeps_the_largest_entries():
    w = torch.randn(64, 64)
    dense = st.sparsify_weight(w, "csr", 0.7).to_dense()
    kept = dense != 0
    assert w[kept].abs().min() >= w[~kept].abs().max()


def test_nm_keeps_the_largest_in_each_group():
    w = torch.randn(8, 16)
    dense = st.sparsify_weight(w, "2:4").to_dense().reshape(8, 4, 4)
    mag = w.abs().reshape(8, 4, 4)
    kept = dense != 0
    assert bool((mag.masked_fill(~kept, float("inf")).amin(2) >= mag.masked_fill(kept, -1).amax(2)).all())


@pytest.mark.parametrize("make", [lambda: torch.randn(512, 768), lambda: low_rank_plus_noise(512, 768)])
@pytest.mark.parametrize("v, sparsity", [(32, 0.9), (64, 0.9), (64, 0.75)])
def test_shuffled_keeps_more_magnitude_than_block(make, v, sparsity):
    w = make()
    _, shfl = st.sparsify_weight(w, f"shfl:{v}", sparsity, return_report=True)
    _, block = st.sparsify_weight(w, f"block:{v}x16", sparsity, return_report=True)
    assert shfl.retained > block.retained
    assert abs(shfl.sparsity - block.sparsity) < 0.01


@pytest.mark.parametrize("rows, cols, sparsity", [(256, 1000, 0.9), (100, 384, 0.75), (64, 40, 0.5)])
def test_shuffled_groups_keep_whole_chunks_of_their_heaviest_columns(rows, cols, sparsity):
    """Each group keeps a multiple of its chunk of columns (or all of them), its heaviest ones, and
    the achieved sparsity stays near the one asked for; a narrow layer gets narrower chunks."""
    from spartune.prune.magnitude import SHFL_CHUNK, shfl_chunk

    chunk = shfl_chunk(cols)
    assert chunk == (SHFL_CHUNK if cols >= 8 * SHFL_CHUNK else 4)
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(3))
    A, report = st.sparsify_weight(w, "shfl:32", sparsity, return_report=True)
    counts = A.cols_per_group()
    assert bool(((counts % chunk == 0) | (counts == cols)).all()), counts
    # whole chunks of 32 rows x `chunk` columns kept while their middle fits the budget
    assert abs(report.sparsity - sparsity) <= 32 * chunk / 2 / (rows * cols)
    slots = w[A.perm.long()]
    for g in range(A.groups):
        mass = (slots[g * 32:(g + 1) * 32].float() ** 2).sum(0)
        kept = torch.zeros(cols, dtype=torch.bool)
        kept[A.col[A.crow[g]:A.crow[g + 1]].long()] = True
        if kept.any() and not kept.all():
            assert mass[kept].min() >= mass[~kept].max()


def test_shuffling_beats_unshuffled_groups_on_structured_weights():
    # rows come in 8 interleaved families that share their important columns
    g = torch.Generator().manual_seed(1)
    families = (torch.rand(8, 512, generator=g) < 0.15).float() * 4 + 1
    w = torch.randn(256, 512, generator=g) * families[torch.arange(256) % 8]
    perm = shuffle_rows(w, 32, 0.15)
    assert sorted(perm.tolist()) == list(range(256))

    def kept(order):
        sq = (w[order] ** 2).reshape(8, 32, 512).sum(1).flatten()
        return torch.topk(sq, int(0.15 * sq.numel())).values.sum() / (w**2).sum()

    assert kept(perm) > kept(torch.arange(256)) * 1.2


@pytest.mark.parametrize("pattern, sparsity, match", [
    ("foo", 0.5, "unknown pattern"),
    ("block:48", 0.5, "must be one of"),
    ("shfl:24", 0.5, "must be one of"),
    ("4:2", None, "N:M needs"),
    ("64:3:8", None, "N must be 2"),
    ("csr", None, "needs a sparsity"),
    ("csr", 1.5, "in \\[0, 1\\]"),
    ("2:4", 0.9, "fixes the sparsity"),
    ("64:2:2", None, "M in 4..128"),
])
def test_bad_patterns(pattern, sparsity, match):
    with pytest.raises(ValueError, match=match):
        st.sparsify_weight(torch.randn(64, 64), pattern, sparsity)


def test_pattern_must_be_a_string():
    with pytest.raises(TypeError):
        st.sparsify_weight(torch.randn(4, 4), 64, 0.5)


def test_extreme_sparsities():
    w = torch.randn(40, 50)
    assert st.sparsify_weight(w, "csr", 1.0).nnz == 0
    assert torch.equal(st.sparsify_weight(w, "shfl:16", 0.0).to_dense(), w)
    assert st.sparsify_weight(w, "block:16", 1.0).nnz == 0


@pytest.mark.parametrize("pattern, shape", [("csr", (1, 1)), ("block:64", (64, 64)), ("block:64", (64, 10))])
def test_a_tie_at_the_budget_keeps_the_unit(pattern, shape):
    """One unit at 50%: kept (as torch.nn.utils.prune counts: round(0.5) entries pruned), never
    the whole layer pruned away for a sparsity of one half."""
    w = torch.randn(*shape)
    A = st.sparsify_weight(w, pattern, 0.5)
    assert torch.equal(A.to_dense(), w)


def test_the_count_pruned_is_torchs():
    from torch.nn.utils import prune

    for n in range(1, 120):
        w = torch.randn(1, n)
        for sparsity in (0.1, 0.25, 0.3, 0.5, 0.7, 0.9):
            kept = int((st.sparsify_weight(w, "csr", sparsity).to_dense() != 0).sum())
            torchs = int(prune.l1_unstructured(torch.nn.Linear(n, 1), "weight", amount=sparsity).weight_mask.sum())
            assert kept == torchs, (n, sparsity)


@pytest.mark.parametrize("shape,sparsity,want", [((100, 70), 0.9, 1 - 600 / 7000), ((96, 96), 0.9, 1 - 1024 / 9216)])
def test_block_pruning_keeps_edge_blocks_that_fit_past_a_full_one_that_does_not(shape, sparsity, want):
    """The budget of a small weight fits no full 64 x 64 block but does fit its edge blocks:
    they are kept (the weight was pruned to zeros)."""
    torch.manual_seed(0)
    w = torch.randn(*shape)
    fmt, report = sparsify_weight(w, "block:64", sparsity, return_report=True)
    dense = fmt.to_dense()
    assert report.sparsity == pytest.approx(want) and (dense != 0).sum() == round((1 - want) * w.numel())
    assert torch.equal(dense[dense != 0], w[dense != 0])


@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.9), ("block:16", 0.75), ("shfl:16", 0.75), ("2:4", None),
                                              ("64:2:8", None)])
def test_the_kept_positions_do_not_depend_on_the_weight_s_scale(pattern, sparsity):
    torch.manual_seed(1)
    w = torch.randn(128, 128)
    kept = sparsify_weight(w, pattern, sparsity).to_dense() != 0
    for scaled in (w * 1e25, w * 1e-30, w.double() * 1e-200, w.double() * 1e200):
        assert torch.equal(sparsify_weight(scaled, pattern, sparsity).to_dense() != 0, kept)


def test_a_pruned_parameter_keeps_no_autograd_history_and_nan_is_refused():
    p = torch.nn.Parameter(torch.randn(32, 32))
    assert sparsify_weight(p, "csr", 0.5).values.grad_fn is None
    w = torch.randn(8, 8)
    w[2, 3] = float("nan")
    before = w.clone()
    with pytest.raises(ValueError, match="NaN"):
        sparsify_weight(w, "csr", 0.5)
    assert torch.equal(w.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.5), ("block:16", 0.5), ("2:4", None), ("16:2:8", None)])
def test_a_weight_without_rows_prunes_to_an_empty_format(pattern, sparsity):
    assert sparsify_weight(torch.randn(0, 64), pattern, sparsity).shape == (0, 64)
