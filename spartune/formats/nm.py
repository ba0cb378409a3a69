"""Semi-structured sparsity: N:M along K, and VENOM's V:N:M on top of the hardware 2:4."""
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
    check_range,
    check_tensor,
    stats_from_counts,
)

POSITION = (torch.uint8,)


def pick_positions(nonzero: torch.Tensor, k: int) -> torch.Tensor:
    """Along the last dim, `k` positions holding every nonzero, padded with the first free
    positions, in increasing order. The caller has checked that nonzeros number <= k."""
    n = nonzero.shape[-1]
    order = torch.arange(n, 0, -1, device=nonzero.device)  # earlier positions win ties
    score = nonzero.to(torch.int64) * (n + 1) + order
    return torch.sort(torch.topk(score, k, dim=-1).indices, dim=-1).values


def _first_offender(bad: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(bad)[0].tolist())


def _check_positions(name: str, idx: torch.Tensor, limit: int, per: int) -> None:
    check_range(name, idx, 0, limit)
    if per > 1 and idx.numel():
        grouped = idx.reshape(-1, per).long()
        if bool((grouped[:, 1:] <= grouped[:, :-1]).any()):
            raise ValueError(f"{name} must be strictly increasing within each group of {per}")


@dataclass(frozen=True, eq=False, repr=False)
class NM(SparseFormat):
    """In every run of M consecutive columns of a row, N entries are stored.

    `values[r, g*N + i]` sits at column `g*M + idx[r, g*N + i]`. K that is not a multiple of
    M is padded inside; stored entries in the padding are zero.
    """

    shape: tuple[int, int]
    n: int
    m: int
    values: torch.Tensor  # (rows, groups * n)
    idx: torch.Tensor  # uint8 (rows, groups * n): position inside the group of m

    @classmethod
    def from_dense(cls, w: torch.Tensor, n: int = 2, m: int = 4) -> "NM":
        check_dense_weight(w)
        _check_nm(n, m)
        rows, cols = w.shape
        groups = ceil_div(cols, m)
        runs = F.pad(w, (0, groups * m - cols)).reshape(rows, groups, m)
        nz = runs != 0
        bad = nz.sum(2) > n
        if bool(bad.any()):
            r, g = _first_offender(bad)
            raise ValueError(
                f"w is not {n}:{m} sparse: row {r}, columns {g * m}..{g * m + m - 1} hold "
                f"{int(nz[r, g].sum())} nonzeros (at most {n} allowed)"
            )
        idx = pick_positions(nz, n)
        return cls(
            shape=(rows, cols),
            n=n,
            m=m,
            values=torch.gather(runs, 2, idx).reshape(rows, groups * n).contiguous(),
            idx=idx.reshape(rows, groups * n).to(torch.uint8).contiguous(),
        )

    @property
    def signature(self) -> str:
        return f"{self.n}:{self.m}"

    @property
    def groups(self) -> int:
        return ceil_div(self.shape[1], self.m)

    def _validate(self) -> None:
        rows, cols = self.shape
        _check_nm(self.n, self.m)
        shape = (rows, self.groups * self.n)
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=2, shape=shape)
        check_tensor("idx", self.idx, dtypes=POSITION, dim=2, shape=shape, device=self.values.device)
        _check_positions("idx", self.idx, self.m, self.n)
        if self.groups * self.m != cols and bool(self._columns().ge(cols).logical_and(self.values != 0).any()):
            raise ValueError("values stored in the column padding (beyond K) must be zero")

    def _columns(self) -> torch.Tensor:
        base = torch.arange(self.groups, device=self.idx.device).repeat_interleave(self.n) * self.m
        return base + self.idx.long()

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        rows, cols = self.shape
        out = torch.zeros(rows, self.groups * self.m, dtype=values.dtype, device=values.device)
        out.scatter_(1, self._columns(), values)
        return out[:, :cols].contiguous()

    def _compute_stats(self) -> FormatStats:
        rows, cols = self.shape
        nnz = int(self._columns().lt(cols).sum().item())
        return stats_from_counts(rows, cols, nnz, 1, 1, torch.full((rows,), nnz / max(rows, 1)))


@dataclass(frozen=True, eq=False, repr=False)
class VNM(SparseFormat):
    """V:N:M (VENOM): every block of V rows x M columns keeps the same 4 columns for all its
    rows, and each row keeps 2 of those 4, so the inner product runs on the 2:4 sparse
    tensor cores; density 2/M.

    `cols[b, g]` are the 4 kept columns (offsets inside the M-block) of row-block b,
    column-block g; `values[r, 2g + i]` sits at column `g*M + cols[r // V, g, idx[r, 2g + i]]`.
    """

    shape: tuple[int, int]
    v: int
    m: int
    cols: torch.Tensor  # uint8 (row blocks, col blocks, 4)
    values: torch.Tensor  # (padded rows, col blocks * 2)
    idx: torch.Tensor  # uint8 (padded rows, col blocks * 2): which of the 4 columns

    n = 2  # per row inside the 4 kept columns: the hardware's 2:4

    @classmethod
    def from_dense(cls, w: torch.Tensor, v: int = 64, m: int = 8) -> "VNM":
        check_dense_weight(w)
        check_block_size("v", v)
        _check_vnm_m(m)
        rows, cols = w.shape
        rb, cb = ceil_div(rows, v), ceil_div(cols, m)
        blocks = F.pad(w, (0, cb * m - cols, 0, rb * v - rows)).reshape(rb, v, cb, m)
        nz = blocks != 0
        col_nz = nz.any(1)  # (rb, cb, m)
        bad = col_nz.sum(2) > 4
        if bool(bad.any()):
            b, g = _first_offender(bad)
            raise ValueError(
                f"w is not {v}:2:{m} sparse: the block of rows {b * v}..{b * v + v - 1}, columns "
                f"{g * m}..{g * m + m - 1} uses {int(col_nz[b, g].sum())} columns (at most 4 allowed)"
            )
        kept = pick_positions(col_nz, 4)  # (rb, cb, 4)
        gathered = torch.gather(blocks, 3, kept[:, None].expand(rb, v, cb, 4))  # (rb, v, cb, 4)
        row_nz = gathered != 0
        bad = row_nz.sum(3) > 2
        if bool(bad.any()):
            b, r, g = _first_offender(bad)
            raise ValueError(
                f"w is not {v}:2:{m} sparse: row {b * v + r} holds more than 2 nonzeros in columns "
                f"{g * m}..{g * m + m - 1}"
            )
        idx = pick_positions(row_nz, 2)  # (rb, v, cb, 2)
        return cls(
            shape=(rows, cols),
            v=v,
            m=m,
            cols=kept.to(torch.uint8).contiguous(),
            values=torch.gather(gathered, 3, idx).reshape(rb * v, cb * 2).contiguous(),
            idx=idx.reshape(rb * v, cb * 2).to(torch.uint8).contiguous(),
        )

    @property
    def signature(self) -> str:
        return f"{self.v}:2:{self.m}"

    @property
    def row_blocks(self) -> int:
        return ceil_div(self.shape[0], self.v)

    @property
    def col_blocks(self) -> int:
        return ceil_div(self.shape[1], self.m)

    def _validate(self) -> None:
        rows, cols = self.shape
        check_block_size("v", self.v)
        _check_vnm_m(self.m)
        dev = self.values.device
        rb, cb = self.row_blocks, self.col_blocks
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=2, shape=(rb * self.v, cb * 2))
        check_tensor("idx", self.idx, dtypes=POSITION, dim=2, shape=(rb * self.v, cb * 2), device=dev)
        check_tensor("cols", self.cols, dtypes=POSITION, dim=3, shape=(rb, cb, 4), device=dev)
        _check_positions("cols", self.cols, self.m, 4)
        _check_positions("idx", self.idx, 4, 2)
        outside = self._columns().ge(cols)
        outside[rows:] = True
        if bool(outside.logical_and(self.values != 0).any()):
            raise ValueError("values stored in the padding (beyond the matrix) must be zero")

    def _columns(self) -> torch.Tensor:
        """Absolute column of every stored value, (padded rows, col blocks * 2)."""
        rb, cb, v = self.row_blocks, self.col_blocks, self.v
        per_row = self.cols.long().repeat_interleave(v, 0)  # (rb*v, cb, 4)
        inner = torch.gather(per_row, 2, self.idx.long().reshape(rb * v, cb, 2))
        base = torch.arange(cb, device=self.idx.device)[None, :, None] * self.m
        return (base + inner).reshape(rb * v, cb * 2)

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        rows, cols = self.shape
        out = torch.zeros(self.row_blocks * self.v, self.col_blocks * self.m, dtype=values.dtype, device=values.device)
        out.scatter_(1, self._columns(), values)
        return out[:rows, :cols].contiguous()

    def _compute_stats(self) -> FormatStats:
        rows, cols = self.shape
        inside = self._columns()[:rows].lt(cols)
        nnz = int(inside.sum().item())
        return stats_from_counts(rows, cols, nnz, self.v, 1, torch.full((self.row_blocks,), 4.0 * self.col_blocks))


def _check_nm(n, m) -> None:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (n, m)) or not (1 <= n < m <= 128):
        raise ValueError(f"N:M needs integers 1 <= N < M <= 128, got {n}:{m}")


def _check_vnm_m(m) -> None:
    if isinstance(m, bool) or not isinstance(m, int) or not 4 <= m <= 128:
        raise ValueError(f"V:N:M needs an integer M in 4..128, got {m!r}")
