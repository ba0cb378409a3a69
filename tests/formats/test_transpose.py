"""transposed(A) is exactly A^T, memoised per object with its values kept current; gather is
the adjoint of _scatter (what a weight gradient needs)."""
import pytest
import torch

import spartune as st
from spartune.formats import memo, transposed
from spartune.formats._base import index_dtype
from helpers import pattern_weight, random_weight


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _shuffled(rows, cols, v, seed):
    w = random_weight(rows, cols, 0.2, gen=_gen(seed))
    return st.ShuffledBlock.from_dense(w, v, perm=torch.randperm(rows, generator=_gen(seed + 1)).to(torch.int32))


MAKERS = {
    "csr": lambda: pattern_weight("csr", 37, 53, gen=_gen(1))[1],
    "block 16": lambda: pattern_weight("block:16", 40, 50, 0.6, gen=_gen(2))[1],
    "block 16x32": lambda: pattern_weight("block:16x32", 37, 70, 0.6, gen=_gen(3))[1],
    "block 32x16": lambda: pattern_weight("block:32x16", 45, 33, 0.5, gen=_gen(4))[1],
    "shfl 16": lambda: _shuffled(45, 30, 16, 5),
    "2:4": lambda: pattern_weight("2:4", 21, 30, gen=_gen(6))[1],
    "1:4": lambda: pattern_weight("1:4", 20, 31, gen=_gen(7))[1],
    "64:2:8": lambda: pattern_weight("64:2:8", 70, 45, gen=_gen(8))[1],
    "16:2:16": lambda: pattern_weight("16:2:16", 37, 50, gen=_gen(9))[1],
}
EMPTY = {
    "csr": lambda w: st.CSR.from_dense(w),
    "block 16x32": lambda w: st.BlockSparse.from_dense(w, (16, 32)),
    "shfl 16": lambda w: st.ShuffledBlock.from_dense(w, 16),
    "2:4": lambda w: st.NM.from_dense(w, 2, 4),
    "16:2:16": lambda w: st.VNM.from_dense(w, 16, 16),
}


def check_transpose(A):
    T = transposed(A)
    assert torch.equal(T.to_dense(), A.to_dense().T)
    assert torch.equal(T.mask(), A.mask().T), "every stored position is kept, explicit zeros included"
    assert T.dtype == A.dtype and T.device == A.device and T.shape == A.shape[::-1]
    if isinstance(A, st.BlockSparse):
        assert isinstance(T, st.BlockSparse) and T.block == A.block[::-1]
        same = st.BlockSparse.from_dense(A.mask().T.float(), T.block)
    else:
        assert isinstance(T, st.CSR) and T.col.dtype == index_dtype(A.shape[0])
        same = st.CSR.from_dense(A.mask().T.float())  # row_order longest first, as from_dense picks
        assert torch.equal(T.row_order, same.row_order)
    assert torch.equal(T.crow, same.crow) and torch.equal(T.col, same.col)
    return T


@pytest.mark.parametrize("name", list(MAKERS))
def test_transposed_is_the_transpose(name):
    A = MAKERS[name]()
    assert A.nnz > 0
    check_transpose(A)
    check_transpose(A.with_values(torch.zeros_like(A.values)))  # all values 0: the pattern stays


@pytest.mark.parametrize("name", list(EMPTY))
def test_empty_matrix(name):
    A = EMPTY[name](torch.zeros(37, 50))
    assert not check_transpose(A).to_dense().any()


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0)])
def test_degenerate_shapes(shape):
    check_transpose(st.CSR.from_dense(torch.zeros(shape)))
    check_transpose(st.BlockSparse.from_dense(torch.zeros(shape), 16))


@pytest.mark.parametrize("name", list(MAKERS))
def test_gather_is_the_adjoint_of_scatter(name):
    A = MAKERS[name]()
    assert torch.equal(A.gather(A.to_dense()), A.values)  # padding slots hold zeros in both
    assert torch.equal(A.with_values(A.gather(A.to_dense())).to_dense(), A.to_dense())
    ones = A.gather(torch.ones(A.shape))
    assert torch.equal(A.with_values(ones).to_dense(), A.mask().float())
    assert int(ones.sum()) == A.nnz, "padding slots gather zeros"
    v, D = torch.randn(A.values.shape, generator=_gen(0)).double(), torch.randn(A.shape, generator=_gen(1)).double()
    torch.testing.assert_close((A._scatter(v) * D).sum(), (v * A.gather(D)).sum())
    with pytest.raises(ValueError, match="shape"):
        A.gather(torch.ones(A.shape[0] + 1, A.shape[1]))


@pytest.mark.parametrize("name", list(MAKERS))
def test_transposed_is_memoised_and_follows_in_place_updates(name):
    A = MAKERS[name]()
    T = transposed(A)
    assert transposed(A) is T

    def dense_T():  # a memo of T's values
        return memo(T, "_test_dense", T.to_dense)

    assert torch.equal(dense_T(), A.to_dense().T)
    A.values.mul_(2)  # an optimizer step
    assert transposed(A) is T and torch.equal(T.to_dense(), A.to_dense().T)
    assert torch.equal(dense_T(), A.to_dense().T), "T's value memos see the new values"
    # Another object of the same pattern shares the index structure, not the transposed object.
    B = A._with_values_trusted(A.values * -3)
    TB = transposed(B)
    assert TB is not T and torch.equal(TB.to_dense(), B.to_dense().T)
    assert TB.crow is T.crow  # the pattern built once
    A.values.add_(1.0)
    assert torch.equal(transposed(A).to_dense(), A.to_dense().T)
    assert transposed(B) is TB and torch.equal(TB.to_dense(), B.to_dense().T)


def test_trainable_values_give_a_detached_transpose():
    """A parameter's transpose holds a copy: gradients flow through A.gather, not A^T."""
    A = MAKERS["csr"]()
    A = A.with_values(torch.nn.Parameter(A.values.clone()))
    T = transposed(A)
    assert not T.values.requires_grad
    with torch.no_grad():
        A.values.sub_(0.5)
    assert transposed(A) is T and torch.equal(T.to_dense(), A.to_dense().detach().T)


def test_transposed_takes_a_format_only():
    with pytest.raises(TypeError, match="must be a spartune format"):
        transposed(torch.randn(3, 3))
