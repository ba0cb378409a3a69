"""cuBLAS on the decompressed weight: the baseline every op must beat, and the fallback of
sddmm / sparse_softmax (the dense product, then the stored positions gathered)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import reference
from ..formats import PATTERN_CACHES, SparseFormat
from . import _common


def dense_weight(A: SparseFormat) -> torch.Tensor:
    return _common.cached(A, "dense", A.to_dense)


def dense_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0):
    """cuBLAS on the decompressed weight. Returns F.linear's own result when that is the whole
    op (no copy into `out`); other epilogues run as separate torch ops, as a user without
    spartune would write them."""
    w = dense_weight(A)
    if activation is None and residual is None and scale == 1.0 and out.dtype == x.dtype:
        return F.linear(x, w, None if bias is None else bias.to(w.dtype))
    return _common.finish(F.linear(x, w), out, bias, activation, residual, scale)


def dense_sddmm(a, b, pattern, scale):
    """sddmm as the dense product a @ b^T (fp32), gathered at the pattern's stored positions."""
    return _gather_values(pattern, (a.float() @ b.float().T) * scale).to(a.dtype)


def dense_softmax(A, scale):
    """sparse_softmax as the dense reference, gathered at A's stored positions."""
    return _gather_values(A, reference.sparse_softmax(A, scale)).to(A.dtype)


def value_order(pattern):
    """Value positions in row-major order of their (row, col), to compare with mask-indexed references."""
    return _stored_positions(pattern)[0]


def _gather_values(pattern, dense):
    """The entries of `dense` at the pattern's stored positions, in the pattern's value order."""
    order, flat = _stored_positions(pattern)
    out = torch.zeros(pattern.values.numel(), dtype=dense.dtype, device=dense.device)
    out[order] = dense.reshape(-1)[flat]
    return out.reshape(pattern.values.shape)


_POSITIONS_KEY = "_spartune_stored_positions"
PATTERN_CACHES.add(_POSITIONS_KEY)


def _stored_positions(pattern):
    """(order, flat), int64 (nnz,) each, in row-major order of the stored entries: their slots
    in `values` and their flat positions in the dense (rows, cols) matrix. Memoised on the
    pattern: the dense backends of sddmm / sparse_softmax gather with them on every call."""
    cached = pattern.__dict__.get(_POSITIONS_KEY)
    if cached is None:
        mask = pattern.mask()
        idx = pattern._scatter(torch.arange(pattern.values.numel(), device=pattern.device, dtype=torch.float64)
                               .reshape(pattern.values.shape))
        cached = (idx[mask].long(), mask.reshape(-1).nonzero().squeeze(1))
        object.__setattr__(pattern, _POSITIONS_KEY, cached)
    return cached
