"""The bitmap-tile copy of a CSR weight that the csr_bitmap family streams (src/spmm_csr_bitmap.cu).

A is cut in 16 x 16 tiles (rows of tiles padded to an even count, so a warp takes them in pairs),
each four 8 x 8 sub-tiles in the order of mma.m16n8k16's A fragment: s = 2 * (column >= 8) +
(row >= 8), bit 8 * (row % 8) + column % 8 of sub-tile s's 64-bit map. Values lie tile by tile,
sub-tile by sub-tile, in bit order, so lane l of a warp finds its two values (bits 2l, 2l + 1)
at the tile's first value + the values of the sub-tiles before + a popcount below bit 2l.
Each tile's 48-byte record (int32 words):
    0-3  the low words of the four maps (the bits of lanes 0-15)
    4-7  their high words (lanes 16-31)
    8    the tile's first value (an index into `values`)
    9    byte s: the values of sub-tiles 0 .. s - 1
    10   byte s: the set bits of sub-tile s's low word (lanes 16-31 start past them)
    11   0
Built once per weight and memoised on the CSR object, like the sliced ELL copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import CSR, memo

RECORD_WORDS = 12
VALUE_PADDING = 8


@dataclass(frozen=True)
class BitmapTiles:
    records: torch.Tensor  # int32 ((row_tiles * k_tiles + 2) * 12,): a pair of tiles of padding last
    values: torch.Tensor  # A's dtype (nnz + VALUE_PADDING,), tile order: a lane reads two from its place
    tile_base: torch.Tensor  # int32 (row_tiles * k_tiles + 1,): each tile's first value, then nnz
    row_tiles: int
    k_tiles: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.records, self.values, self.tile_base))


def bitmap_tiles(A: CSR) -> BitmapTiles:
    return memo(A, "_bitmap_tiles", lambda: _build(A))


def _build(A: CSR) -> BitmapTiles:
    M, K = A.shape
    nnz = A.col.numel()
    if nnz >= 2 ** 31:
        raise ValueError(f"bitmap tiles index values in 32 bits: {nnz} nonzeros is too many")
    dev = A.col.device
    row_tiles, k_tiles = -(-M // 16), 2 * -(-K // 32)
    tiles = row_tiles * k_tiles
    lengths = (A.crow[1:] - A.crow[:-1]).long()
    r = torch.repeat_interleave(torch.arange(M, device=dev), lengths, output_size=nnz)
    c = A.col.long()
    sub = ((r // 16) * k_tiles + c // 16) * 4 + (c % 16 // 8) * 2 + r % 16 // 8
    bit = (r % 8) * 8 + c % 8
    order = torch.argsort(sub * 64 + bit)
    values = torch.cat([A.values[order], A.values.new_zeros(VALUE_PADDING)])
    maps = torch.zeros(tiles * 4, dtype=torch.int64, device=dev)
    maps.scatter_add_(0, sub, torch.ones_like(bit) << bit)  # distinct bits: the sum is their OR
    counts = torch.bincount(sub, minlength=tiles * 4).view(tiles, 4)
    low = torch.bincount(sub[bit < 32], minlength=tiles * 4).view(tiles, 4)
    before = counts.cumsum(1) - counts
    tile_base = torch.zeros(tiles + 1, dtype=torch.int64, device=dev)
    tile_base[1:] = counts.sum(1).cumsum(0)
    shifts = torch.tensor([0, 8, 16, 24], device=dev)
    rec = torch.zeros(tiles + 2, RECORD_WORDS, dtype=torch.int64, device=dev)  # (a warp loads one pair ahead)
    rec[:tiles, :8] = maps.view(tiles, 4).view(torch.int32).view(tiles, 4, 2).transpose(1, 2).reshape(tiles, 8).long()
    rec[:tiles, 8] = tile_base[:-1]
    rec[:tiles, 9] = (before << shifts).sum(1)
    rec[:tiles, 10] = (low << shifts).sum(1)
    rec = torch.where(rec >= 2 ** 31, rec - 2 ** 32, rec)  # the words' bits as int32
    return BitmapTiles(rec.to(torch.int32).view(-1), values, tile_base.to(torch.int32), row_tiles, k_tiles)


def to_dense(t: BitmapTiles, shape: tuple[int, int]) -> torch.Tensor:
    """The weight the tiles hold (tests): every set bit's value at its place."""
    M, K = shape
    rec = t.records.view(-1, RECORD_WORDS)[:t.row_tiles * t.k_tiles]
    maps = rec[:, :8].reshape(-1, 2, 4).transpose(1, 2).contiguous().view(torch.int64).view(-1)  # (tiles * 4,)
    bits = (maps.unsqueeze(1) >> torch.arange(64, device=maps.device)) & 1
    sub, bit = bits.nonzero(as_tuple=True)  # in value order: sub-tile, then bit
    tile, s = sub // 4, sub % 4
    rows = tile // t.k_tiles * 16 + s % 2 * 8 + bit // 8
    cols = tile % t.k_tiles * 16 + s // 2 * 8 + bit % 8
    dense = torch.zeros(t.row_tiles * 16, t.k_tiles * 16, dtype=t.values.dtype, device=t.values.device)
    dense[rows, cols] = t.values[:rows.numel()]
    return dense[:M, :K]
