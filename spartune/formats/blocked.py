"""Block-sparse rows (BSR): dense (bm, bk) tiles that tensor cores multiply directly."""
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
    pointers_from_counts,
    stats_from_counts,
    unit_of_items,
)


def parse_block(block) -> tuple[int, int]:
    """`64` or `(64, 32)` -> (bm, bk), each in {16, 32, 64, 128}."""
    if isinstance(block, int) and not isinstance(block, bool):
        block = (block, block)
    if not isinstance(block, (tuple, list)) or len(block) != 2:
        raise ValueError(f"block must be an int or a pair (bm, bk), got {block!r}")
    return check_block_size("bm", block[0]), check_block_size("bk", block[1])


@dataclass(frozen=True, eq=False, repr=False)
class BlockSparse(SparseFormat):
    """Block-rows of dense (bm, bk) blocks.

    Shapes that are not multiples of the block are padded inside: edge blocks carry zeros
    beyond the matrix, which `to_dense` crops, so the padding never shows.
    """

    shape: tuple[int, int]
    block: tuple[int, int]
    crow: torch.Tensor  # int32 (block_rows + 1,)
    col: torch.Tensor  # int32 (nnzb,): block-column index
    values: torch.Tensor  # (nnzb, bm, bk)

    @classmethod
    def from_dense(cls, w: torch.Tensor, block=64) -> "BlockSparse":
        """Every block of `w` that holds a nonzero is kept."""
        check_dense_weight(w)
        bm, bk = parse_block(block)
        rows, cols = w.shape
        br, bc = ceil_div(rows, bm), ceil_div(cols, bk)
        padded = F.pad(w, (0, bc * bk - cols, 0, br * bm - rows))
        tiles = padded.reshape(br, bm, bc, bk).transpose(1, 2)  # (br, bc, bm, bk)
        keep = (tiles != 0).flatten(2).any(2)  # (br, bc)
        r, c = torch.nonzero(keep, as_tuple=True)
        return cls(
            shape=(rows, cols),
            block=(bm, bk),
            crow=pointers_from_counts(keep.sum(1)),
            col=c.to(torch.int32),
            values=tiles[r, c].contiguous(),
        )

    @property
    def signature(self) -> str:
        return f"block:{self.block[0]}x{self.block[1]}"

    @property
    def block_rows(self) -> int:
        return ceil_div(self.shape[0], self.block[0])

    @property
    def block_cols(self) -> int:
        return ceil_div(self.shape[1], self.block[1])

    def _validate(self) -> None:
        rows, cols = self.shape
        bm, bk = parse_block(self.block)
        dev = self.values.device
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=3)
        nnzb = self.values.shape[0]
        if tuple(self.values.shape[1:]) != (bm, bk):
            raise ValueError(f"values must have shape (nnzb, {bm}, {bk}), got {tuple(self.values.shape)}")
        check_pointers("crow", self.crow, self.block_rows, nnzb)
        check_tensor("crow", self.crow, dtypes=(torch.int32,), dim=1, device=dev)
        check_tensor("col", self.col, dtypes=(torch.int32,), dim=1, shape=(nnzb,), device=dev)
        check_range("col", self.col, 0, self.block_cols)
        if nnzb:
            row_of = unit_of_items(self.crow)
            check_sorted_within_units("col", row_of, self.col, "block-row")
            # Padding must hold zeros, or to_dense would not be the matrix the kernels compute.
            pad_r, pad_c = self.block_rows * bm - rows, self.block_cols * bk - cols
            if pad_r and bool(self.values[row_of == self.block_rows - 1, bm - pad_r :].ne(0).any()):
                raise ValueError("values outside the matrix (row padding of the last block-row) must be zero")
            if pad_c and bool(self.values[self.col == self.block_cols - 1, :, bk - pad_c :].ne(0).any()):
                raise ValueError("values outside the matrix (column padding of the last block-column) must be zero")

    def blocks_per_row(self) -> torch.Tensor:
        return self.crow[1:] - self.crow[:-1]

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        (rows, cols), (bm, bk) = self.shape, self.block
        tiles = torch.zeros(self.block_rows, self.block_cols, bm, bk, dtype=values.dtype, device=values.device)
        tiles[unit_of_items(self.crow, self.col.numel()), self.col.long()] = values
        dense = tiles.transpose(1, 2).reshape(self.block_rows * bm, self.block_cols * bk)
        return dense[:rows, :cols].contiguous()

    def _compute_stats(self) -> FormatStats:
        (rows, cols), (bm, bk) = self.shape, self.block
        counts = self.blocks_per_row()
        if counts.numel():
            # Stored entries inside the matrix: edge blocks are partly padding.
            r_in = torch.clamp(rows - torch.arange(self.block_rows) * bm, max=bm)
            c_in = torch.clamp(cols - self.col.long().cpu() * bk, max=bk)
            nnz = int((torch.repeat_interleave(r_in, counts.long().cpu()) * c_in).sum().item())
        else:
            nnz = 0
        return stats_from_counts(rows, cols, nnz, bm, bk, counts)
