"""The tiled copy of a CSR weight that the csr_tc family expands for the tensor cores.

A is cut in tiles of 16 rows x 64 columns (one mma.m16n8k16 row tile over four K steps). A tile's
nonzeros are 32-bit words, a warp's 32 lanes taking one word each per round:

    word = position << 16 | value bits,   position = row in tile * 64 + column in tile (0 .. 1023)

padded to whole rounds with TRASH words (position 1024, value 0), which the kernel scatters into
one spare slot past the tile. Tiles are stored row tile by row tile, each row tile's K tiles in
order, so a CTA's (row tiles, K slice) block is a few contiguous runs; `starts[rt * k_tiles + kt]`
is where tile (rt, kt) begins, in rounds of 32 words. Built once per weight, values and pattern,
and memoised on the CSR object.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import CSR, memo

TILE_M, TILE_K = 16, 64
ROUND = 32  # words per round (one per lane)
TRASH = TILE_M * TILE_K  # the position of padding words


@dataclass(frozen=True)
class TileWords:
    words: torch.Tensor  # int32 (rounds * 32,)
    starts: torch.Tensor  # int32 (row_tiles * k_tiles + 1,): where each tile starts, in rounds
    row_tiles: int
    k_tiles: int

    @property
    def nbytes(self) -> int:
        return self.words.numel() * 4 + self.starts.numel() * 4


def tile_words(A: CSR) -> TileWords:
    """A's tiled words, memoised on A."""
    return memo(A, "_tile_words", lambda: _build(A))


def rounds_per_warp(A: CSR, k_slice_tiles: int, warps: int, rows_per_warp: int) -> int:
    """The most rounds of words one warp of csr_tc copies into shared memory: the runs of its
    row tiles (rt0, rt0 + warps, ...) in one slice of `k_slice_tiles` K tiles, memoised on A."""
    key = f"_tile_words_rounds_{k_slice_tiles}_{warps}_{rows_per_warp}"
    return memo(A, key, lambda: _rounds_per_warp(tile_words(A), k_slice_tiles, warps, rows_per_warp),
                of_values=False)


def _rounds_per_warp(layout: TileWords, kt: int, warps: int, rpw: int) -> int:
    slices = -(-layout.k_tiles // kt)
    block = warps * rpw
    rows = -(-layout.row_tiles // block) * block
    first = torch.arange(layout.row_tiles, device=layout.starts.device)[:, None] * layout.k_tiles
    cuts = torch.clamp(torch.arange(slices + 1, device=first.device) * kt, max=layout.k_tiles)
    at = layout.starts.long()[first + cuts]  # (row tiles, slices + 1)
    runs = torch.zeros(rows, slices, dtype=torch.int64, device=first.device)
    runs[: layout.row_tiles] = at[:, 1:] - at[:, :-1]
    # row tile b * block + r * warps + w belongs to warp w of block b
    return int(runs.reshape(-1, rpw, warps, slices).sum(1).max())


def _build(A: CSR) -> TileWords:
    if A.values.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"csr_tc runs fp16 / bf16 weights, got {A.values.dtype}")
    M, K = A.shape
    device = A.values.device
    row_tiles, k_tiles = -(-M // TILE_M), -(-K // TILE_K)
    counts = A.crow[1:] - A.crow[:-1]
    rows = torch.repeat_interleave(torch.arange(M, device=device), counts.long())
    cols = A.col.long()
    tile = (rows // TILE_M) * k_tiles + cols // TILE_K
    position = (rows % TILE_M) * TILE_K + cols % TILE_K
    bits = A.values.view(torch.int16).int() & 0xFFFF
    word = (position.int() << 16) | bits
    order = torch.argsort(tile, stable=True)
    tile, word = tile[order], word[order]
    per_tile = torch.bincount(tile, minlength=row_tiles * k_tiles)
    rounds = (per_tile + ROUND - 1) // ROUND
    starts = torch.zeros(row_tiles * k_tiles + 1, dtype=torch.int64, device=device)
    torch.cumsum(rounds, 0, out=starts[1:])
    total = int(starts[-1]) * ROUND
    words = torch.full((max(total, ROUND),), TRASH << 16, dtype=torch.int32, device=device)
    first = torch.cumsum(per_tile, 0) - per_tile  # each tile's first nonzero among the sorted ones
    rank = torch.arange(tile.numel(), device=device) - first[tile]
    words[starts[tile] * ROUND + rank] = word
    return TileWords(words, starts.int(), row_tiles, k_tiles)
