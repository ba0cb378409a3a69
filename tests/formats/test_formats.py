"""Round trips, properties and input errors of the five formats."""
import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as hs

import spartune as st
from spartune.formats import nm as nm_format
from helpers import block_weight, random_weight

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BLOCKS = [16, 32, 64, 128]

shapes = hs.tuples(hs.integers(0, 150), hs.integers(0, 150))
densities = hs.sampled_from([0.0, 0.05, 0.3, 1.0])
dtypes = hs.sampled_from(DTYPES)


def check_common(fmt, w):
    assert torch.equal(fmt.to_dense(), w)
    assert fmt.to_dense().dtype == w.dtype and fmt.shape == tuple(w.shape)
    assert fmt.dtype == w.dtype and fmt.device == w.device
    mask = fmt.mask()
    assert fmt.nnz == int(mask.sum())
    assert bool(mask[w != 0].all()), "every nonzero must be stored"
    assert fmt.density == pytest.approx(fmt.nnz / max(1, w.numel()))
    assert fmt.nbytes >= fmt.values.numel() * fmt.values.element_size()
    moved = fmt.to("cpu")
    assert torch.equal(moved.to_dense(), w)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fmt.values = fmt.values  # immutable
    s = fmt.stats()
    assert s.rows == w.shape[0] and s.cols == w.shape[1] and s.items_cv >= 0


@given(shapes, densities, dtypes, hs.randoms())
def test_csr_round_trip(shape, density, dtype, rnd):
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    w = random_weight(*shape, density, dtype, g)
    if shape[0] > 2:
        w[1] = 0  # an empty row
    fmt = st.CSR.from_dense(w)
    check_common(fmt, w)
    lengths = fmt.row_lengths()[fmt.row_order.long()]
    assert bool((lengths[:-1] >= lengths[1:]).all()), "row_order must list the longest rows first"
    assert fmt.col.dtype == torch.int16
    assert fmt.stats().items_mean == pytest.approx(fmt.nnz / max(1, shape[0]))


def test_csr_wide_matrix_uses_int32_indices():
    w = random_weight(3, 40000, 0.001)
    w[0, 39999] = 1.0
    fmt = st.CSR.from_dense(w)
    assert fmt.col.dtype == torch.int32
    assert torch.equal(fmt.to_dense(), w)


@given(shapes, hs.sampled_from(BLOCKS), hs.sampled_from(BLOCKS), densities, dtypes, hs.randoms())
def test_block_round_trip(shape, bm, bk, density, dtype, rnd):
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    w = block_weight(*shape, bm, bk, density, dtype, g)
    fmt = st.BlockSparse.from_dense(w, (bm, bk))
    check_common(fmt, w)
    assert fmt.values.shape[1:] == (bm, bk)
    assert fmt.stats().unit_rows == bm


def test_block_keeps_a_block_with_a_single_nonzero_at_the_edge():
    w = torch.zeros(70, 90)
    w[69, 89] = 3.0
    fmt = st.BlockSparse.from_dense(w, 64)
    assert fmt.values.shape[0] == 1 and fmt.nnz == 6 * 26
    assert torch.equal(fmt.to_dense(), w)


@given(shapes, hs.sampled_from(BLOCKS), densities, dtypes, hs.randoms())
def test_shuffled_round_trip(shape, v, density, dtype, rnd):
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    w = random_weight(*shape, density, dtype, g)
    perm = torch.randperm(shape[0], generator=g).to(torch.int32)
    fmt = st.ShuffledBlock.from_dense(w, v, perm)
    check_common(fmt, w)
    assert fmt.values.shape[0] == v


@given(shapes, hs.sampled_from([(1, 2), (2, 4), (1, 4), (2, 8), (4, 8), (3, 7)]), dtypes, hs.randoms())
def test_nm_round_trip(shape, nm, dtype, rnd):
    n, m = nm
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    rows, cols = shape
    groups = -(-cols // m)
    keep = torch.rand(rows, groups, m, generator=g).argsort(-1).argsort(-1) < n  # n random positions
    keep &= torch.rand(rows, groups, m, generator=g) < 0.9  # some groups hold fewer than n
    w = torch.where(keep.reshape(rows, groups * m)[:, :cols], torch.randn(rows, groups * m, generator=g)[:, :cols], 0.0).to(dtype)
    fmt = st.NM.from_dense(w, n, m)
    check_common(fmt, w)
    bits = nm_format.position_bits(m)
    assert fmt.idx.dtype == torch.uint8 and fmt.idx.shape == (rows, -(-groups * n // (8 // bits)))
    # the positions one a byte (a checkpoint of before the packing) make the same format
    legacy = st.NM(shape=shape, n=n, m=m, values=fmt.values, idx=fmt.positions.clone())
    assert torch.equal(legacy.idx, fmt.idx) and torch.equal(legacy.to_dense(), w)


@given(shapes, hs.sampled_from([16, 32]), hs.sampled_from([4, 5, 8, 16, 128]), dtypes, hs.randoms())
def test_vnm_round_trip(shape, v, m, dtype, rnd):
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    w = torch.randn(*shape, generator=g).to(dtype)
    dense = st.sparsify_weight(w, f"{v}:2:{m}").to_dense()
    if shape[0] > 2:
        dense[0] = 0  # an empty row
    fmt = st.VNM.from_dense(dense, v, m)
    check_common(fmt, dense)
    # every (V x M) block uses at most 4 columns, and every row at most 2 of them
    rows, cols = shape
    assert fmt.cols.shape == (-(-rows // v), -(-cols // m), 4)


@pytest.mark.parametrize("make, holds_dense", [
    (lambda w: st.CSR.from_dense(w), True),
    (lambda w: st.BlockSparse.from_dense(w, 16), True),
    (lambda w: st.ShuffledBlock.from_dense(w, 16), True),
    (lambda w: st.NM.from_dense(w, 2, 4), False),
    (lambda w: st.VNM.from_dense(w, 16, 8), False),
])
def test_all_zero_and_all_dense(make, holds_dense):
    zero = torch.zeros(33, 40)
    assert torch.equal(make(zero).to_dense(), zero) and make(zero).values.abs().sum() == 0
    dense = torch.randn(33, 40)
    if holds_dense:
        assert torch.equal(make(dense).to_dense(), dense)
    else:
        with pytest.raises(ValueError, match="is not"):
            make(dense)


# --- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, exc", [
    (torch.randn(4), ValueError),
    (torch.randn(2, 3, 4), ValueError),
    (torch.ones(3, 3, dtype=torch.int32), TypeError),
    ([[1.0, 2.0]], TypeError),
    (torch.eye(3).to_sparse(), TypeError),
])
@pytest.mark.parametrize("make", [st.CSR.from_dense, st.BlockSparse.from_dense, st.ShuffledBlock.from_dense, st.NM.from_dense, st.VNM.from_dense])
def test_from_dense_rejects_bad_weights(make, bad, exc):
    with pytest.raises(exc):
        make(bad)


def test_bad_block_and_group_sizes():
    w = torch.randn(8, 8)
    for bad in (48, 0, 256, (64, 48), "64", True):
        with pytest.raises(ValueError, match="must be one of|block must be"):
            st.BlockSparse.from_dense(w, bad)
    with pytest.raises(ValueError, match="v must be one of"):
        st.ShuffledBlock.from_dense(w, 24)
    with pytest.raises(ValueError, match="N:M needs"):
        st.NM.from_dense(w, 4, 4)
    with pytest.raises(ValueError, match="M in 4..128"):
        st.VNM.from_dense(w, 16, 3)


def test_nm_names_the_offending_row():
    w = st.sparsify_weight(torch.randn(6, 16), "2:4").to_dense()
    w[3, 9] = w[3, 10] = w[3, 11] = w[3, 8] = 1.0
    with pytest.raises(ValueError, match=r"row 3, columns 8..11"):
        st.NM.from_dense(w, 2, 4)


def test_vnm_names_the_offending_block_and_row():
    w = st.sparsify_weight(torch.randn(32, 16), "16:2:8").to_dense()
    bad_cols = w.clone()
    bad_cols[20, 8:16] = 0
    bad_cols[20, 8:13] = 1.0  # 5 columns used in the block of rows 16..31, columns 8..15 (and 5 in row 20)
    with pytest.raises(ValueError, match=r"rows 16..31, columns 8..15 uses"):
        st.VNM.from_dense(bad_cols, 16, 8)
    fmt = st.VNM.from_dense(w, 16, 8)
    c = fmt.cols[0, 0].long()
    bad_row = w.clone()
    bad_row[5, c[:3]] = 1.0  # 3 of the 4 kept columns in row 5
    with pytest.raises(ValueError, match=r"row 5 holds more than 2"):
        st.VNM.from_dense(bad_row, 16, 8)


def test_constructor_validates_indices():
    fmt = st.CSR.from_dense(random_weight(5, 7, 0.5) + torch.eye(5, 7))
    with pytest.raises(ValueError, match="col must lie in"):
        dataclasses.replace(fmt, col=(fmt.col + 7).to(torch.int16))
    with pytest.raises(TypeError, match="col must have dtype"):
        dataclasses.replace(fmt, col=fmt.col.long())
    bad = fmt.crow.clone()
    bad[2] = bad[3] + 1  # decreases after row 2
    with pytest.raises(ValueError, match="crow"):
        dataclasses.replace(fmt, crow=bad)
    with pytest.raises(ValueError, match="permutation"):
        dataclasses.replace(fmt, row_order=torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="strictly increasing"):
        dataclasses.replace(fmt, col=fmt.col.flip(0).contiguous())
    with pytest.raises(TypeError, match="values must be a floating"):
        dataclasses.replace(fmt, values=fmt.values.long())
    with pytest.raises(ValueError, match="shape"):
        dataclasses.replace(fmt, shape=(5, -1))
    b = st.BlockSparse.from_dense(torch.randn(20, 20), 16)
    with pytest.raises(ValueError, match="padding"):
        dataclasses.replace(b, values=torch.ones_like(b.values))
    with pytest.raises(ValueError, match="values must have shape"):
        b.with_values(b.values[:1])
    s = st.ShuffledBlock.from_dense(torch.randn(20, 20), 16)
    with pytest.raises(ValueError, match="perm must be a permutation"):
        dataclasses.replace(s, perm=torch.zeros(20, dtype=torch.int32))
    nm = st.NM.from_dense(st.sparsify_weight(torch.randn(4, 8), "2:4").to_dense(), 2, 4)
    with pytest.raises(ValueError, match="idx must lie in"):
        dataclasses.replace(nm, idx=nm.positions + 4)


def test_with_values_keeps_the_pattern():
    w = random_weight(12, 30, 0.3) + torch.eye(12, 30)
    fmt = st.CSR.from_dense(w)
    twice = fmt.with_values(fmt.values * 2)
    assert torch.equal(twice.to_dense(), 2 * w) and torch.equal(fmt.to_dense(), w)


@given(hs.sampled_from([1, 2, 4, 8]), hs.integers(0, 5), hs.integers(0, 13), hs.randoms())
def test_positions_pack_and_unpack(bits, rows, count, rnd):
    g = torch.Generator().manual_seed(rnd.randint(0, 2**31))
    positions = torch.randint(0, 1 << bits, (rows, count), generator=g).to(torch.uint8)
    codes = nm_format.pack_positions(positions, bits)
    assert codes.dtype == torch.uint8 and codes.shape == (rows, -(-count // (8 // bits)))
    assert torch.equal(nm_format.unpack_positions(codes, bits, count), positions)


def test_two_to_four_stores_two_bits_a_position():
    """A 2:4 weight's positions take a sixteenth of its dense bytes (fp16): values + codes are
    0.5625x of dense, as the hardware's metadata is."""
    fmt = st.sparsify_weight(torch.randn(64, 256, dtype=torch.float16), "2:4")
    assert fmt.idx.numel() == 64 * 256 // 8 and fmt.positions.shape == (64, 128)
    assert fmt.values.numel() * 2 + fmt.idx.numel() == 0.5625 * 64 * 256 * 2


def test_packed_positions_refuse_stray_codes_and_bad_positions():
    w = torch.randn(4, 12) * (torch.arange(12) % 4 < 2)  # 2:4, three groups: 6 positions, two bytes a row
    fmt = st.NM.from_dense(w, 2, 4)
    bad = fmt.idx.clone()
    bad[:, -1] |= 0x40  # a code past the row's last position
    with pytest.raises(ValueError, match="past a row's last position"):
        dataclasses.replace(fmt, idx=bad)
    with pytest.raises(ValueError, match="idx must have shape"):
        dataclasses.replace(fmt, idx=fmt.idx[:, :1].contiguous())
    vnm = st.VNM.from_dense(torch.randn(16, 16) * (torch.arange(16) % 8 < 2), 16, 8)
    assert vnm.idx.shape == (16, 1) and torch.equal(
        st.VNM(shape=vnm.shape, v=16, m=8, cols=vnm.cols, values=vnm.values, idx=vnm.positions.clone()).to_dense(),
        vnm.to_dense())


@pytest.mark.parametrize("pattern, sparsity", [("csr", 0.9), ("block:16", 0.5), ("shfl:16", 0.5), ("2:4", None),
                                               ("64:2:8", None)])
def test_to_takes_tensor_to_forms(pattern, sparsity):
    """A.to(dtype), A.to(device, dtype), A.to(dtype=...): the values cast, the indices kept."""
    A = st.sparsify_weight(torch.randn(64, 128), pattern, sparsity)
    for B, dtype in ((A.to(torch.float16), torch.float16), (A.to("cpu", torch.float64), torch.float64),
                     (A.to(dtype=torch.bfloat16), torch.bfloat16), (A.to("cpu"), torch.float32)):
        assert type(B) is type(A) and B.dtype == dtype
        assert torch.equal(B.to_dense(), A.to_dense().to(dtype))
        assert all(torch.equal(b, a) for b, a in zip(B.tensor_list()[1:], A.tensor_list()[1:]))
    with pytest.raises(TypeError, match="floating dtype"):
        A.to(torch.int32)
    for B in (A.to(copy=True), A.to("cpu", copy=True), A.to(torch.float32, copy=True)):  # new memory, same pattern
        assert torch.equal(B.to_dense(), A.to_dense())
        assert all(b.data_ptr() != a.data_ptr() for b, a in zip(B.tensor_list(), A.tensor_list()) if a.numel())
    assert A.to("cpu") is A  # nothing to do, no copy asked: the same object, as Tensor.to


def test_a_numpy_sparsity_is_a_number():
    import numpy as np

    A = st.sparsify_weight(torch.randn(16, 16), "csr", np.float32(0.75))
    assert A.stats().density == 0.25
