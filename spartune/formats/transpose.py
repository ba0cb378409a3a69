"""A^T as a sparse format: the backward pass of y = x @ A^T needs dx = dy @ A, the forward op on A^T.

Block-sparse stays block-sparse (each block transposed); every other format becomes CSR, since
transposing N:M, V:N:M or Shfl-BW groups breaks their structure. The index structure is built
once per pattern; each format object keeps one transposed object whose values follow its own.
"""
from __future__ import annotations

import torch

from ._base import SparseFormat, index_dtype, memo, pointers_from_counts, unit_of_items, values_anchor, values_version
from .blocked import BlockSparse
from .csr import CSR

_PLAN = "_transpose_plan"  # pattern memo: (template, src)
_OWN = "_transposed"  # this object's [values version copied, A^T, src]: never shared


def transposed(A: SparseFormat) -> SparseFormat:
    """The format of A^T (`transposed(A).to_dense()` equals `A.to_dense().T`), same dtype and device.

    Memoised on A: every call returns the same object, so whatever the dispatch caches per
    object (tuned choices, packed layouts) survives. After an in-place update of A.values (an
    optimizer step) its values are refreshed in place by one gather, without a host sync. They
    are a detached copy: the weight gradient comes from `A.gather`, not through A^T.
    """
    if not isinstance(A, SparseFormat):
        raise TypeError(f"transposed: A must be a spartune format, got {type(A).__name__}")
    own = A.__dict__.get(_OWN)
    version = values_version(A.values)
    if own is None:
        first = _PLAN not in A.__dict__
        template, src = memo(A, _PLAN, lambda: _plan(A), of_values=False)
        # The object that built the plan takes its template (no values held twice); others of
        # the same pattern (new values from _with_values_trusted) get the template's pattern.
        T = template if first else template._with_values_trusted(_values(A, src))
        own = [version, T, src, values_anchor(A.values)]
        object.__setattr__(A, _OWN, own)
    elif own[0] != version:
        own[1].values.copy_(_values(A, own[2]))
        own[0], own[3] = version, values_anchor(A.values)
    return own[1]


def _values(A: SparseFormat, src: torch.Tensor) -> torch.Tensor:
    """A^T's values: slot i holds A's value slot src[i] (src has A^T's values shape)."""
    with torch.no_grad():
        return A.values.reshape(-1)[src]


def _plan(A: SparseFormat) -> tuple[SparseFormat, torch.Tensor]:
    """A validated A^T and, for each of its value slots, the slot of A's values it copies."""
    rows, cols = A.shape
    if isinstance(A, BlockSparse):
        (bm, bk), col = A.block, A.col.long()
        by_col = torch.argsort(col, stable=True)  # block-rows stay ascending inside a block-column
        slots = torch.arange(A.values.numel(), device=A.device).reshape(A.values.shape)
        src = slots[by_col].transpose(1, 2).contiguous()
        T = BlockSparse(shape=(cols, rows), block=(bk, bm),
                        crow=pointers_from_counts(torch.bincount(col, minlength=A.block_cols)),
                        col=unit_of_items(A.crow)[by_col].to(torch.int32), values=_values(A, src))
        return T, src
    order, flat = A.stored_positions()  # row-major in A, so rows stay ascending inside a column
    r, c = flat // max(cols, 1), flat % max(cols, 1)
    by_col = torch.argsort(c, stable=True)
    counts = torch.bincount(c, minlength=cols)
    src = order[by_col]
    T = CSR(shape=(cols, rows), crow=pointers_from_counts(counts), col=r[by_col].to(index_dtype(rows)),
            values=_values(A, src), row_order=torch.argsort(counts, descending=True, stable=True).to(torch.int32))
    return T, src


__all__ = ["transposed"]
