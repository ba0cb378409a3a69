"""Semi-structured sparsity: N:M along K, and VENOM's V:N:M on top of the hardware 2:4."""
from __future__ import annotations

import dataclasses
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


def position_bits(m: int) -> int:
    """Bits a stored position inside a group of m takes: 1, 2, 4 or 8 (a code never straddles a
    byte). 2 for 2:4: a 2:4 weight stores 2 + 0.25 bytes a kept fp16 value, as the hardware's
    metadata does, not 3."""
    need = max(1, (m - 1).bit_length())
    return next(b for b in (1, 2, 4, 8) if b >= need)


def _check_bits(bits) -> None:
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"positions are packed 1, 2, 4 or 8 bits each (position_bits), got {bits!r}")


def pack_positions(positions: torch.Tensor, bits: int) -> torch.Tensor:
    """(rows, count) positions below 2**bits as uint8 codes, 8 // bits a byte, the first in the low
    bits; a row's last byte is padded with zero codes."""
    _check_bits(bits)
    per = 8 // bits
    if per == 1:
        return positions.to(torch.uint8).contiguous()
    rows, count = positions.shape
    grouped = F.pad(positions.to(torch.int32), (0, -count % per)).reshape(rows, -(-count // per), per)
    shifts = torch.arange(per, device=positions.device, dtype=torch.int32) * bits
    return (grouped << shifts).sum(-1).to(torch.uint8)  # (disjoint bit fields: the sum is their OR)


def unpack_positions(codes: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """pack_positions' inverse: (rows, count) uint8 positions."""
    _check_bits(bits)
    per = 8 // bits
    if per == 1:
        return codes.clone()
    shifts = torch.arange(per, device=codes.device, dtype=torch.int32) * bits
    positions = (codes.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return positions.reshape(codes.shape[0], codes.shape[1] * per)[:, :count].to(torch.uint8)


def _packed_positions(fmt, count: int, bits: int) -> None:
    """A format constructed with its positions one a byte (as checkpoints stored them before
    2026-11-27, and as a caller may hold them) keeps them packed: `idx` holds the codes."""
    idx = fmt.idx
    if bits < 8 and isinstance(idx, torch.Tensor) and idx.dim() == 2 and idx.shape[1] == count > 1:
        check_tensor("idx", idx, dtypes=POSITION, dim=2)
        check_range("idx", idx, 0, 1 << bits)
        object.__setattr__(fmt, "idx", pack_positions(idx, bits))


def _well_formed(shape, *ints) -> bool:
    """Whether the fields the packing reads are plain ints (the validation reports the rest)."""
    return isinstance(shape, tuple) and len(shape) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in (*shape, *ints))


def _check_codes(name: str, codes: torch.Tensor, rows: int, count: int, bits: int, device) -> torch.Tensor:
    """The positions `codes` hold, once their dtype, shape and padding are checked."""
    per = 8 // bits
    check_tensor(name, codes, dtypes=POSITION, dim=2, shape=(rows, -(-count // per)), device=device)
    positions = unpack_positions(codes, bits, count)
    if per > 1 and count % per and bool((codes[:, -1].to(torch.int32) >> (count % per * bits)).any()):
        raise ValueError(f"{name}: the codes past a row's last position must be zero")
    return positions


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

    `values[r, g*N + i]` sits at column `g*M + positions[r, g*N + i]`. K that is not a multiple
    of M is padded inside; stored entries in the padding are zero. `idx` holds the positions
    packed, `position_bits(M)` each (2 for 2:4); the constructor also takes them one a byte.
    """

    shape: tuple[int, int]
    n: int
    m: int
    values: torch.Tensor  # (rows, groups * n)
    idx: torch.Tensor  # uint8 (rows, ceil(groups * n / (8 // bits))): the positions, packed

    def _canonicalize(self) -> None:
        if _well_formed(self.shape, self.n, self.m) and 1 <= self.m <= 128:
            _packed_positions(self, ceil_div(self.shape[1], self.m) * self.n, position_bits(self.m))

    @property
    def positions(self) -> torch.Tensor:
        """uint8 (rows, groups * n): each stored value's position inside its group of m."""
        return unpack_positions(self.idx, position_bits(self.m), self.groups * self.n)

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
            idx=pack_positions(idx.reshape(rows, groups * n), position_bits(m)),
        )

    @property
    def signature(self) -> str:
        return f"{self.n}:{self.m}"

    @property
    def groups(self) -> int:
        return ceil_div(self.shape[1], self.m)

    def _check_static(self) -> None:
        _check_nm(self.n, self.m)

    def _values_shape(self) -> tuple[int, int]:
        return self.shape[0], self.groups * self.n

    def _validate(self) -> None:
        rows, cols = self.shape
        self._check_static()
        shape = self._values_shape()
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=2, shape=shape)
        positions = _check_codes("idx", self.idx, rows, shape[1], position_bits(self.m), self.values.device)
        _check_positions("idx", positions, self.m, self.n)
        if self.groups * self.m != cols and bool(self._columns().ge(cols).logical_and(self.values != 0).any()):
            raise ValueError("values stored in the column padding (beyond K) must be zero")

    def _columns(self) -> torch.Tensor:
        base = torch.arange(self.groups, device=self.idx.device).repeat_interleave(self.n) * self.m
        return base + self.positions.long()

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        rows, cols = self.shape
        out = torch.zeros(rows, self.groups * self.m, dtype=values.dtype, device=values.device)
        out.scatter_(1, self._columns(), values)
        return out[:, :cols].contiguous()

    def _compute_stats(self) -> FormatStats:
        rows, cols = self.shape
        nnz = int(self._columns().lt(cols).sum().item())
        return stats_from_counts(rows, cols, nnz, 1, 1, torch.full((rows,), nnz / max(rows, 1)))


def tile_steps(cols: int) -> int:
    """K steps (32 dense columns each) of PackedNM's tiles for K = cols: whole fours (the wgmma
    variant's stages take two steps, its pipeline an even number of stages)."""
    return ceil_div(cols, 128) * 4


def tile_order(values: torch.Tensor, tiles: int, k_steps: int) -> torch.Tensor:
    """Canonical kept values (rows, kept) -> (tiles * k_steps, 256) in the tensor cores' order:
    per (16-row tile, 32-column K step of the 2:4 matrix), four 8 x 8 core matrices (row half,
    column half, row, value); rows padded to tiles * 16 and K to k_steps * 16 kept with zeros.
    The one definition of the layout that PackedNM / PackedVNM store and the kernels read."""
    rows, kept = values.shape
    v = F.pad(values, (0, k_steps * 16 - kept, 0, tiles * 16 - rows))
    return v.reshape(tiles, 2, 8, k_steps, 2, 8).permute(0, 3, 1, 4, 2, 5).reshape(tiles * k_steps, 256).contiguous()


class _TileOrder:
    """What PackedNM and PackedVNM share: the values of the 2:4 matrix the sparse tensor cores
    multiply (NM's rows; V:N:M's kept columns) stored in the order the kernels read them, so they
    read the values themselves instead of a packed copy beside them (the canonical rows and the
    kernels' packing were the weight's kept values twice: benchmarks/LOG.md, sessions 29-30).

    `values` is (tiles * K steps, 256): per (16-row tile, 32-column K step of that 2:4 matrix), in
    that order, the tile's 16 x 16 kept values as four 8 x 8 core matrices (row half, column half,
    row, value), rows padded to 16 and K steps to `tile_steps` with zeros. Every other tensor is
    the canonical format's; `_scatter` permutes back, so to_dense, gradients (`gather`), stats,
    state_dict and from_spec work as for it. `pack(A)` and `unpack()` convert. A layer's
    `weight_values` is then this (units, 256) matrix: elementwise optimizers (SGD, Adam) keep its
    zero padding zero (its gradient is zero there), one that mixes a matrix's entries (Shampoo,
    Muon) would not, and the kernels read the padding: train such a layer canonical (`unpack`)."""

    _canonical: type  # the format whose values these are, permuted; its `_values_shape` and
    # `_check_static` (the canonical values' shape, its static fields' checks) serve both

    @staticmethod
    def _tile_grid(rows: int, kept: int) -> tuple[int, int]:
        """(tiles, K steps) for canonical values (rows, kept): the 2:4 matrix has 2 * kept columns."""
        return ceil_div(rows, 16), tile_steps(2 * kept)

    @classmethod
    def stored_numel(cls, A) -> int:
        """Values a packing of the canonical `A` stores, tile padding included."""
        mt, kt = cls._tile_grid(*A.values.shape)
        return mt * kt * 256

    @property
    def tiles(self) -> int:
        return self._tile_grid(*self._values_shape())[0]

    @property
    def k_steps(self) -> int:
        return self._tile_grid(*self._values_shape())[1]

    def _matrix_cols(self) -> int:
        """Columns of the 2:4 matrix the tensor cores multiply."""
        return 2 * self._values_shape()[1]

    @classmethod
    def pack(cls, A):
        if type(A) is not cls._canonical:
            raise ValueError(f"{cls.__name__} packs {cls._canonical.__name__} weights, got {type(A).__name__}")
        fields = {f.name: getattr(A, f.name) for f in dataclasses.fields(A)}
        fields["values"] = tile_order(A.values, *cls._tile_grid(*A.values.shape))
        return cls(**fields)

    def unpack(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return self._canonical(**{**fields, "values": self._rows(self.values)})

    def _all_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Values in this layout -> (tiles * 16, k_steps * 16) rows, padding included."""
        mt, kt = self.tiles, self.k_steps
        return values.reshape(mt, kt, 2, 2, 8, 8).permute(0, 2, 4, 1, 3, 5).reshape(mt * 16, kt * 16)

    def _rows(self, values: torch.Tensor) -> torch.Tensor:
        """Values in this layout -> the canonical format's."""
        rows, kept = self._values_shape()
        return self._all_rows(values)[:rows, :kept].contiguous()

    def _validate(self) -> None:
        self._check_static()  # (before any arithmetic on the static fields)
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=2, shape=(self.tiles * self.k_steps, 256))
        if self.values.data_ptr() % 16:
            raise ValueError("values must start 16-byte aligned: the kernels read them in place, 16 bytes at a time")
        rows, kept = self._values_shape()
        full = self._all_rows(self.values)
        if bool(full[rows:].ne(0).any() or full[:, kept:].ne(0).any()):
            raise ValueError("values stored in the tile padding (past the matrix) must be zero")
        self.unpack()  # the canonical format's own checks (a transient copy, at construction only)

    def _scatter(self, values: torch.Tensor) -> torch.Tensor:
        return self._canonical._scatter(self, self._rows(values))


@dataclass(frozen=True, eq=False, repr=False)
class PackedNM(_TileOrder, NM):
    """A 2:4 NM weight in the sparse tensor cores' tile order (see _TileOrder): what `sparsify`
    keeps for a 2:4 layer. `values` (tiles * K steps, 256); `idx` as NM's."""

    shape: tuple[int, int]
    n: int
    m: int
    values: torch.Tensor  # (tiles * k_steps, 256)
    idx: torch.Tensor  # uint8 (rows, groups * n / 4): the positions, packed as NM's

    _canonical = NM

    @classmethod
    def pack(cls, A: NM) -> "PackedNM":
        if type(A) is NM and (A.n, A.m) != (2, 4):
            raise ValueError(f"PackedNM holds 2:4 weights, got {A.signature}")
        return super().pack(A)

    @classmethod
    def from_dense(cls, w: torch.Tensor, n: int = 2, m: int = 4) -> "PackedNM":
        return cls.pack(NM.from_dense(w, n, m))

    def _check_static(self) -> None:
        NM._check_static(self)
        if (self.n, self.m) != (2, 4):
            raise ValueError(f"PackedNM holds 2:4 weights, got {self.n}:{self.m}")


@dataclass(frozen=True, eq=False, repr=False)
class VNM(SparseFormat):
    """V:N:M (VENOM): every block of V rows x M columns keeps the same 4 columns for all its
    rows, and each row keeps 2 of those 4, so the inner product runs on the 2:4 sparse
    tensor cores; density 2/M.

    `cols[b, g]` are the 4 kept columns (offsets inside the M-block) of row-block b,
    column-block g; `values[r, 2g + i]` sits at column `g*M + cols[r // V, g, positions[r, 2g + i]]`.
    `idx` holds the positions (which of the 4 columns) packed, 2 bits each; the constructor also
    takes them one a byte.
    """

    shape: tuple[int, int]
    v: int
    m: int
    cols: torch.Tensor  # uint8 (row blocks, col blocks, 4)
    values: torch.Tensor  # (padded rows, col blocks * 2)
    idx: torch.Tensor  # uint8 (padded rows, ceil(col blocks / 2)): the positions, 2 bits each

    n = 2  # per row inside the 4 kept columns: the hardware's 2:4

    def _canonicalize(self) -> None:
        if _well_formed(self.shape, self.m) and self.m > 0:
            _packed_positions(self, ceil_div(self.shape[1], self.m) * 2, 2)

    @property
    def positions(self) -> torch.Tensor:
        """uint8 (padded rows, col blocks * 2): which of its block's 4 kept columns each value sits in."""
        return unpack_positions(self.idx, 2, self.col_blocks * 2)

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
            idx=pack_positions(idx.reshape(rb * v, cb * 2), 2),
        )

    @property
    def signature(self) -> str:
        return f"{self.v}:2:{self.m}"

    def as_2to4(self) -> NM:
        """The same matrix as a 2:4 NM over all of K, where M is a multiple of 4 (exact: each group
        of 4 columns lies in one M-column block, where a row keeps 2): what as_24 kernels run."""
        if self.m % 4:
            raise ValueError(f"a {self.signature} weight is no 2:4 one: its {self.m}-column blocks straddle "
                             "groups of 4")
        return NM.from_dense(self.to_dense(), 2, 4)

    @property
    def row_blocks(self) -> int:
        return ceil_div(self.shape[0], self.v)

    @property
    def col_blocks(self) -> int:
        return ceil_div(self.shape[1], self.m)

    def _check_static(self) -> None:
        check_block_size("v", self.v)
        _check_vnm_m(self.m)

    def _values_shape(self) -> tuple[int, int]:
        return self.row_blocks * self.v, self.col_blocks * 2

    def _validate(self) -> None:
        rows, cols = self.shape
        self._check_static()
        dev = self.values.device
        rb, cb = self.row_blocks, self.col_blocks
        check_tensor("values", self.values, dtypes=(self.values.dtype,), dim=2, shape=self._values_shape())
        positions = _check_codes("idx", self.idx, rb * self.v, cb * 2, 2, dev)
        check_tensor("cols", self.cols, dtypes=POSITION, dim=3, shape=(rb, cb, 4), device=dev)
        _check_positions("cols", self.cols, self.m, 4)
        _check_positions("idx", positions, 4, 2)
        outside = self._columns().ge(cols)
        outside[rows:] = True
        if bool(outside.logical_and(self.values != 0).any()):
            raise ValueError("values stored in the padding (beyond the matrix) must be zero")

    def _columns(self) -> torch.Tensor:
        """Absolute column of every stored value, (padded rows, col blocks * 2)."""
        rb, cb, v = self.row_blocks, self.col_blocks, self.v
        per_row = self.cols.long().repeat_interleave(v, 0)  # (rb*v, cb, 4)
        inner = torch.gather(per_row, 2, self.positions.long().reshape(rb * v, cb, 2))
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


@dataclass(frozen=True, eq=False, repr=False)
class PackedVNM(_TileOrder, VNM):
    """A V:N:M weight in the sparse tensor cores' tile order (see _TileOrder): the 2:4 matrix over
    each V-row block's kept columns, as the kernels read it. `values` (tiles * K steps, 256);
    `cols` and `idx` as VNM's."""

    shape: tuple[int, int]
    v: int
    m: int
    cols: torch.Tensor  # uint8 (row blocks, col blocks, 4)
    values: torch.Tensor  # (tiles * k_steps, 256)
    idx: torch.Tensor  # uint8 (padded rows, ceil(col blocks / 2)): the positions, 2 bits each

    _canonical = VNM

    @classmethod
    def from_dense(cls, w: torch.Tensor, v: int = 64, m: int = 8) -> "PackedVNM":
        return cls.pack(VNM.from_dense(w, v, m))


def _check_nm(n, m) -> None:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (n, m)) or not (1 <= n < m <= 128):
        raise ValueError(f"N:M needs integers 1 <= N < M <= 128, got {n}:{m}")


def _check_vnm_m(m) -> None:
    if isinstance(m, bool) or not isinstance(m, int) or not 4 <= m <= 128:
        raise ValueError(f"V:N:M needs an integer M in 4..128, got {m!r}")
