"""The one-pass CSR decompression (the lean policy's dense product) equals to_dense: empty rows,
a full row, K past one zeroing block, int16 and int32 columns, every float dtype."""
import pytest
import torch

from spartune import CSR
from spartune.kernels.densify import BLOCK_K, csr_to_dense


def _weight(rows, cols, density, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g).to(dtype)
    w[torch.rand(rows, cols, generator=g) > density] = 0
    w[0] = 0  # an empty row
    if rows > 2:
        w[2] = torch.randn(cols, generator=g).to(dtype) + 10  # a row with every column
    return w


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols,density", [(5, 7, 0.5), (9, BLOCK_K + 37, 0.1), (3, 1, 1.0)])
def test_csr_to_dense_equals_the_scatter(dtype, rows, cols, density):
    w = _weight(rows, cols, density, dtype)
    A = CSR.from_dense(w)
    got = csr_to_dense(A)
    assert got.dtype == dtype and got.shape == w.shape
    assert torch.equal(got, A.to_dense()) and torch.equal(got, w)


def test_csr_to_dense_with_int32_columns():
    w = _weight(4, 40000, 0.001, torch.float16)  # 40000 columns: int32 indices
    A = CSR.from_dense(w)
    assert A.col.dtype == torch.int32
    assert torch.equal(csr_to_dense(A), w)


def test_an_all_zero_and_an_empty_matrix():
    assert torch.equal(csr_to_dense(CSR.from_dense(torch.zeros(6, 10))), torch.zeros(6, 10))
    assert csr_to_dense(CSR.from_dense(torch.zeros(0, 10))).shape == (0, 10)
