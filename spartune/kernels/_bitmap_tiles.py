"""The bitmap-tile copy of a CSR weight that the csr_bitmap family streams (src/spmm_csr_bitmap.cu).

A is cut in 16 x 16 tiles (rows of tiles padded to an even count, so a warp takes them in pairs),
each four 8 x 8 sub-tiles in the order of mma.m16n8k16's A fragment: s = 2 * (column >= 8) +
(row >= 8). In a sub-tile, lane l of a warp holds the pair of columns 2 (l % 4), 2 (l % 4) + 1 of
row l / 4; bit l of the sub-tile's 32-bit map is set where that pair holds a nonzero, and the
nonempty pairs' 32-bit words (two halves, zero where one is missing) follow one another, tile by
tile, sub-tile by sub-tile, in lane order. So lane l finds its word at the sub-tile's start + the
popcount of the map below bit l. Each tile's 32-byte record (int32 words): the four maps, then
the four sub-tiles' first words. Built once per weight and memoised on the CSR object.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import CSR, memo

RECORD_WORDS = 8


@dataclass(frozen=True)
class BitmapTiles:
    records: torch.Tensor  # int32 ((row_tiles * k_tiles + 2) * 8,): a pair of tiles of padding last
    words: torch.Tensor  # int32 (nonempty pairs + 4,): two halves each, tile order (4 of padding)
    tile_base: torch.Tensor  # int32 (row_tiles * k_tiles + 1,): each tile's first word, then their count
    row_tiles: int
    k_tiles: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.records, self.words, self.tile_base))


def bitmap_tiles(A: CSR) -> BitmapTiles:
    return memo(A, "_bitmap_tiles", lambda: _build(A))


def _build(A: CSR) -> BitmapTiles:
    M, K = A.shape
    nnz = A.col.numel()
    dev = A.col.device
    row_tiles, k_tiles = -(-M // 16), 2 * -(-K // 32)
    tiles = row_tiles * k_tiles
    lengths = (A.crow[1:] - A.crow[:-1]).long()
    r = torch.repeat_interleave(torch.arange(M, device=dev), lengths, output_size=nnz)
    c = A.col.long()
    sub = ((r // 16) * k_tiles + c // 16) * 4 + (c % 16 // 8) * 2 + r % 16 // 8
    lane = (r % 8) * 4 + c % 8 // 2
    pairs, which = torch.unique(sub * 32 + lane, return_inverse=True)  # sorted: tile, sub-tile, lane
    if pairs.numel() >= 2 ** 31:
        raise ValueError(f"bitmap tiles index words in 32 bits: {pairs.numel()} is too many")
    halves = torch.zeros(pairs.numel() + 4, 2, dtype=A.values.dtype, device=dev)
    halves[which, c % 2] = A.values
    words = halves.view(torch.int32).view(-1)
    psub = pairs // 32
    maps = torch.zeros(tiles * 4, dtype=torch.int64, device=dev)
    maps.scatter_add_(0, psub, torch.ones_like(pairs) << (pairs % 32))  # distinct bits: the sum is their OR
    counts = torch.bincount(psub, minlength=tiles * 4)
    starts = counts.cumsum(0) - counts
    tile_base = torch.zeros(tiles + 1, dtype=torch.int64, device=dev)
    tile_base[:-1] = starts.view(tiles, 4)[:, 0]
    tile_base[-1] = pairs.numel()
    rec = torch.zeros(tiles + 2, RECORD_WORDS, dtype=torch.int64, device=dev)  # (a warp loads one pair ahead)
    rec[:tiles, :4] = maps.view(tiles, 4)
    rec[:tiles, 4:] = starts.view(tiles, 4)
    rec = torch.where(rec >= 2 ** 31, rec - 2 ** 32, rec)  # the words' bits as int32
    return BitmapTiles(rec.to(torch.int32).view(-1), words, tile_base.to(torch.int32), row_tiles, k_tiles)


def to_dense(t: BitmapTiles, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The weight the tiles hold (tests): every word's two halves at their places."""
    M, K = shape
    rec = t.records.view(-1, RECORD_WORDS)[:t.row_tiles * t.k_tiles].long() & 0xFFFFFFFF
    maps = rec[:, :4].reshape(-1)  # (tiles * 4,)
    bits = (maps.unsqueeze(1) >> torch.arange(32, device=maps.device)) & 1
    sub, lane = bits.nonzero(as_tuple=True)  # in word order: sub-tile, then lane
    tile, s = sub // 4, sub % 4
    rows = tile // t.k_tiles * 16 + s % 2 * 8 + lane // 4
    cols = tile % t.k_tiles * 16 + s // 2 * 8 + lane % 4 * 2
    dense = torch.zeros(t.row_tiles * 16, t.k_tiles * 16, dtype=dtype, device=maps.device)
    halves = t.words[:rows.numel()].view(dtype).view(-1, 2)
    dense[rows, cols] = halves[:, 0]
    dense[rows, cols + 1] = halves[:, 1]
    return dense[:M, :K]
