"""Unstructured sparsity: compressed sparse rows, with Sputnik's row swizzle."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._base import (
    FormatStats,
    SparseFormat,
    check_dense_weight,
    check_pointers,
    check_range,
    check_sorted_within_units,
    check_tensor,
    index_dtype,
    pointers_from_counts,
    stats_from_counts,
    unit_of_items,
)


@dataclass(frozen=True, eq=False, repr=False)
class CSR(SparseFormat):
    """Rows of (column, value) pairs.

    `row_order` lists the rows longest first: kernels walk rows in that order so heavy rows
    start early and programs of one wave get similar work (Sputnik's row swizzle).
    Column indices are int16 when the matrix has fewer than 32768 columns.
    """

    shape: tuple[int, int]
    crow: torch.Tensor  # int32 (rows + 1,)
    col: torch.Tensor  # int16 / int32 (nnz,)
    values: torch.Tensor  # (nnz,)
    row_order: torch.Tensor  # int32 (rows,): a permutation, longest row first

    @classmethod
    def from_dense(cls, w: torch.Tensor) -> "CSR":
        """Every nonzero of `w` is kept."""
        check_dense_weight(w)
        rows, cols = w.shape
        nz = w != 0
        counts = nz.sum(1)
        r, c = torch.nonzero(nz, as_tuple=True)
        return cls(
            shape=(rows, cols),
            crow=pointers_from_counts(counts),
            col=c.to(index_dtype(cols)),
            values=w[r, c].contiguous(),
            row_order=torch.argsort(counts, descending=True, stable=True).to(torch.int32),
        )

    @property
    def signature(self) -> str:
        return "csr"

    def _validate(self) -> None:
        rows, cols = self.shape
        dev = self.values.device
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=1)
        nnz = self.values.numel()
        check_pointers("crow", self.crow, rows, nnz)
        check_tensor("crow", self.crow, dtypes=(torch.int32,), dim=1, device=dev)
        check_tensor("col", self.col, dtypes=(index_dtype(cols),), dim=1, shape=(nnz,), device=dev)
        check_range("col", self.col, 0, cols)
        check_tensor("row_order", self.row_order, dtypes=(torch.int32,), dim=1, shape=(rows,), device=dev)
        if rows and not torch.equal(
            torch.sort(self.row_order.long()).values, torch.arange(rows, device=dev)
        ):
            raise ValueError("row_order must be a permutation of range(rows)")
        if nnz:
            check_sorted_within_units("col", unit_of_items(self.crow), self.col, "row")

    def row_lengths(self) -> torch.Tensor:
        return self.crow[1:] - self.crow[:-1]

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        rows, cols = self.shape
        out = torch.zeros(rows, cols, dtype=values.dtype, device=values.device)
        out[unit_of_items(self.crow, self.col.numel()), self.col.long()] = values
        return out

    def _compute_stats(self) -> FormatStats:
        rows, cols = self.shape
        return stats_from_counts(rows, cols, self.values.numel(), 1, 1, self.row_lengths())
