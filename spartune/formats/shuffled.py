"""Shuffled block-wise sparsity (Shfl-BW, DAC'22).

Rows are permuted so that groups of V rows share the same kept columns; each group is a
dense V x k_g tile that tensor cores multiply with the gathered rows of the activation.
The permutation costs nothing at run time: kernels apply it when they store the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._base import (
    FormatStats,
    SparseFormat,
    ceil_div,
    check_block_size,
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
class ShuffledBlock(SparseFormat):
    """Groups of V permuted rows, each a dense (V, k_g) tile over its kept columns.

    Slot r of group g is original row `perm[g * V + r]`; the last group may have fewer
    than V rows (its extra slots hold zeros and are never stored to the output).
    `values[:, crow[g]:crow[g+1]]` is group g's tile; `col[crow[g]:crow[g+1]]` its columns.
    """

    shape: tuple[int, int]
    v: int
    perm: torch.Tensor  # int32 (rows,)
    crow: torch.Tensor  # int32 (groups + 1,)
    col: torch.Tensor  # int16 / int32 (total kept columns,)
    values: torch.Tensor  # (v, total kept columns)

    @classmethod
    def from_dense(cls, w: torch.Tensor, v: int = 64, perm: torch.Tensor | None = None) -> "ShuffledBlock":
        """Rows grouped as `perm` says (identity if None); a group keeps every column where
        any of its rows is nonzero."""
        check_dense_weight(w)
        check_block_size("v", v)
        rows, cols = w.shape
        if perm is None:
            perm = torch.arange(rows, dtype=torch.int32, device=w.device)
        _check_perm(perm, rows)
        groups = ceil_div(rows, v)
        grouped = F.pad(w[perm.long()], (0, 0, 0, groups * v - rows)).reshape(groups, v, cols)
        keep = (grouped != 0).any(1)  # (groups, cols)
        g, c = torch.nonzero(keep, as_tuple=True)
        return cls(
            shape=(rows, cols),
            v=v,
            perm=perm.to(device=w.device, dtype=torch.int32).contiguous(),
            crow=pointers_from_counts(keep.sum(1)),
            col=c.to(index_dtype(cols)),
            values=grouped[g, :, c].T.contiguous(),
        )

    @property
    def signature(self) -> str:
        return f"shfl:{self.v}"

    @property
    def groups(self) -> int:
        return ceil_div(self.shape[0], self.v)

    def _validate(self) -> None:
        rows, cols = self.shape
        v = check_block_size("v", self.v)
        dev = self.values.device
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=2)
        total = self.values.shape[1]
        if self.values.shape[0] != v:
            raise ValueError(f"values must have shape (v={v}, total kept columns), got {tuple(self.values.shape)}")
        check_tensor("perm", self.perm, dtypes=(torch.int32,), dim=1, shape=(rows,), device=dev)
        _check_perm(self.perm, rows)
        check_pointers("crow", self.crow, self.groups, total)
        check_tensor("crow", self.crow, dtypes=(torch.int32,), dim=1, device=dev)
        check_tensor("col", self.col, dtypes=(index_dtype(cols),), dim=1, shape=(total,), device=dev)
        check_range("col", self.col, 0, cols)
        if total:
            grp = unit_of_items(self.crow)
            check_sorted_within_units("col", grp, self.col, "group")
            spare = self.groups * v - rows
            if spare and bool(self.values[v - spare :, grp == self.groups - 1].ne(0).any()):
                raise ValueError("values of the last group's unused slots must be zero")

    def cols_per_group(self) -> torch.Tensor:
        return self.crow[1:] - self.crow[:-1]

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        rows, cols = self.shape
        grouped = torch.zeros(self.groups, self.v, cols, dtype=values.dtype, device=values.device)
        grouped[unit_of_items(self.crow, self.col.numel()), :, self.col.long()] = values.T
        out = torch.empty(rows, cols, dtype=values.dtype, device=values.device)
        out[self.perm.long()] = grouped.reshape(self.groups * self.v, cols)[:rows]
        return out

    def _compute_stats(self) -> FormatStats:
        rows, cols = self.shape
        counts = self.cols_per_group()
        rows_in = torch.clamp(rows - torch.arange(self.groups) * self.v, max=self.v)
        nnz = int((rows_in * counts.long().cpu()).sum().item())
        return stats_from_counts(rows, cols, nnz, self.v, 1, counts)


def _check_perm(perm, rows: int) -> None:
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.numel() != rows or perm.is_floating_point():
        raise ValueError(f"perm must be a 1-D integer tensor of length {rows}")
    if rows and not torch.equal(torch.sort(perm.long()).values.cpu(), torch.arange(rows)):
        raise ValueError("perm must be a permutation of range(rows)")
