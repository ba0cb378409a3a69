"""What is not ours but competes: cuBLAS dense, cuSPARSE (through torch.sparse), cuSPARSELt 2:4.

Each backend converts the weight once (cached per format object, dropped with it) and
returns `x @ A^T` (in the caller's `out`, or a tensor of its own when writing into `out`
would cost a copy). They are candidates of the tuner like our kernels, so
spartune is never slower than what a user would otherwise call.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ..epilogue import apply_epilogue
from ..formats import NM, BlockSparse, SparseFormat

_converted: "weakref.WeakKeyDictionary[SparseFormat, dict]" = weakref.WeakKeyDictionary()


def _cached(A: SparseFormat, what: str, make):
    per = _converted.setdefault(A, {})
    if what not in per:
        per[what] = make()
    return per[what]


def dense_weight(A: SparseFormat) -> torch.Tensor:
    return _cached(A, "dense", A.to_dense)


def _finish(acc, out, bias, activation, residual, scale):
    """The epilogue as separate torch ops: libraries do not fuse it."""
    if bias is None and activation is None and residual is None and scale == 1.0:
        out.copy_(acc)
    else:
        out.copy_(apply_epilogue(acc.float(), None if bias is None else bias.float(), activation,
                                 None if residual is None else residual.float(), scale))
    return out


def dense_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0):
    """cuBLAS on the decompressed weight. Returns F.linear's own result when that is the whole
    op (no copy into `out`); other epilogues run as separate torch ops, as a user without
    spartune would write them."""
    w = dense_weight(A)
    if activation is None and residual is None and scale == 1.0 and out.dtype == x.dtype:
        return F.linear(x, w, None if bias is None else bias.to(w.dtype))
    return _finish(F.linear(x, w), out, bias, activation, residual, scale)


def _torch_sparse(A):
    w = dense_weight(A)
    if isinstance(A, BlockSparse) and A.shape[0] % A.block[0] == 0 and A.shape[1] % A.block[1] == 0:
        return w.to_sparse_bsr(A.block)
    return w.to_sparse_csr()


def cusparse_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0):
    """cuSPARSE SpMM (CSR, or BSR for whole blocks) through torch.sparse: y^T = A @ x^T."""
    ws = _cached(A, "cusparse", lambda: _torch_sparse(A))
    return _finish((ws @ x.T).T, out, bias, activation, residual, scale)


def cusparselt_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0):
    """cuSPARSELt 2:4 (torch's semi-structured tensors), for 2:4 weights only."""
    from torch.sparse import to_sparse_semi_structured

    ws = _cached(A, "cusparselt", lambda: to_sparse_semi_structured(dense_weight(A)))
    return _finish(F.linear(x, ws), out, bias, activation, residual, scale)


def library_backends(A: SparseFormat) -> dict:
    """The library backends that can run `A`, by name."""
    found = {"dense": dense_linear}
    if A.device.type == "cuda":
        if A.dtype != torch.bfloat16 or not isinstance(A, BlockSparse):
            found["cusparse"] = cusparse_linear
        if isinstance(A, NM) and (A.n, A.m) == (2, 4) and A.dtype in (torch.float16, torch.bfloat16):
            found["cusparselt"] = cusparselt_linear
    return found
