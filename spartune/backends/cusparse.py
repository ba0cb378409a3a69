"""cuSPARSE SpMM through torch.sparse: the weight as a CSR tensor, or BSR when it is made of
whole blocks."""
from __future__ import annotations

import torch

from ..formats import BlockSparse
from . import _common
from .dense import dense_weight


def whole_blocks(shape, block) -> bool:
    """Whether torch's BSR can hold a (rows, cols) matrix in `block` tiles (it needs no partial tile)."""
    return shape[0] % block[0] == 0 and shape[1] % block[1] == 0


def to_csr(w: torch.Tensor) -> torch.Tensor:
    with _common.quiet():
        return w.to_sparse_csr()


def to_bsr(w: torch.Tensor, block) -> torch.Tensor:
    bm, bk = block
    if not whole_blocks(w.shape, block):
        raise RuntimeError(f"needs M, K multiples of the block {bm}x{bk}")
    with _common.quiet():
        return w.to_sparse_bsr((bm, bk))


def torch_sparse(A) -> torch.Tensor:
    """A as the torch.sparse tensor cuSPARSE runs: BSR for a block-sparse weight of whole
    blocks, CSR otherwise."""
    w = dense_weight(A, keep=False)
    if isinstance(A, BlockSparse) and whole_blocks(A.shape, A.block):
        return to_bsr(w, A.block)
    return to_csr(w)


def cusparse_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0):
    """cuSPARSE SpMM (CSR, or BSR for whole blocks) through torch.sparse: y^T = A @ x^T."""
    ws = _common.cached(A, "cusparse", lambda: torch_sparse(A))
    return _common.finish((ws @ x.T).T, out, bias, activation, residual, scale)
