"""The tiled copy of a CSR weight that the csr_mma family streams (Flash-LLM's tiled format).

The weight is cut in tiles of BR rows x 64 columns, taken in (row tile, column tile) order. Each
nonzero is one 32-bit word, its position in the tile (row * 64 + column) << 16 | its value's
bits, and a tile's words are one run padded to whole 16-byte loads with copies of its last word
(scattered twice, the same value lands twice: no count to check). A kernel reads a tile's run
with `ptr` (run starts, in words) and scatters it into a zeroed dense tile in shared memory.
Built once per weight (values and pattern) and memoised on the CSR object; `split` cuts the
runs over a grid of CTAs by bytes, memoised too (it depends on the pattern only).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..formats import CSR, memo

TILE_K = 64
WORDS_PER_LOAD = 4
# a tile's fixed cost in words (x's 64 columns of the CTA's tokens, the dense tile's zeroing and
# multiply): what `split` counts beside the tile's words when it balances the CTAs
TILE_COST_WORDS = 256


@dataclass(frozen=True)
class TiledCSR:
    words: torch.Tensor  # int32 (total,): the tiles' runs, (row tile, column tile) order
    ptr: torch.Tensor  # int32 (tiles + 1,): where each run starts, a multiple of 4 words
    rows: int  # rows per tile (BR)
    row_tiles: int
    k_tiles: int
    max_run: int  # the longest run in words (a stage's buffer)

    @property
    def nbytes(self) -> int:
        return self.words.numel() * 4 + self.ptr.numel() * 4


def memo_key(rows: int) -> str:
    return f"_tiled_csr_{rows}"


def tiled_csr(A: CSR, rows: int) -> TiledCSR:
    """A's tiled copy for tiles of `rows` rows, memoised on A."""
    return memo(A, memo_key(rows), lambda: _build(A, rows))


def drop_tiled_csr(A: CSR, keep: set[str] = frozenset()) -> None:
    """Forget the copies (and their splits) whose memo keys are not in `keep`."""
    for key in [k for k in A.__dict__ if k.startswith("_tiled_csr_") and k.split("@")[0] not in keep]:
        del A.__dict__[key]


def _build(A: CSR, rows: int) -> TiledCSR:
    if rows % 16 or not 16 <= rows <= 1024:
        raise ValueError(f"tiles of a multiple of 16 rows, at most 1024 (positions in 16 bits): got {rows}")
    M, K = A.shape
    device = A.values.device
    row_tiles, k_tiles = -(-M // rows), -(-K // TILE_K)
    counts = (A.crow[1:] - A.crow[:-1]).long()
    r = torch.repeat_interleave(torch.arange(M, device=device), counts)
    c = A.col.long()
    tile = (r // rows) * k_tiles + c // TILE_K
    order = torch.argsort(tile, stable=True)  # a tile's nonzeros in row order
    tile = tile[order]
    pos = ((r % rows) * TILE_K + c % TILE_K)[order]
    bits = A.values.detach().view(torch.int16)[order].long() & 0xFFFF
    word = (pos << 16) | bits
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)

    tiles = row_tiles * k_tiles
    per_tile = torch.bincount(tile, minlength=tiles)
    padded = (per_tile + WORDS_PER_LOAD - 1) // WORDS_PER_LOAD * WORDS_PER_LOAD
    ptr = torch.zeros(tiles + 1, dtype=torch.long, device=device)
    ptr[1:] = torch.cumsum(padded, 0)
    first = torch.cumsum(per_tile, 0) - per_tile  # where each tile's nonzeros start in `word`
    # slot s of tile t holds its nonzero min(s, count - 1): the padding repeats the last word
    slot_tile = torch.repeat_interleave(torch.arange(tiles, device=device), padded)
    slot = torch.arange(int(ptr[-1]), device=device) - ptr[slot_tile]
    source = first[slot_tile] + torch.minimum(slot, per_tile[slot_tile] - 1)
    words = word[source].contiguous()
    return TiledCSR(words, ptr.to(torch.int32), rows, row_tiles, k_tiles, int(padded.max()) if tiles else 0)


def split(A: CSR, tiled: TiledCSR, ctas: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(bounds: int32 (ctas + 1,) the first tile of each CTA; row_split: int32 (row tiles, 2), each
    row tile's first CTA and how many CTAs share it; the most tiles a CTA takes), the tiles cut
    in `ctas` contiguous runs of about equal cost (words plus TILE_COST_WORDS a tile). Memoised
    with the copy."""
    key = f"{memo_key(tiled.rows)}@{ctas}"
    return memo(A, key, lambda: _split(tiled, ctas), of_values=False)


def _split(tiled: TiledCSR, ctas: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    ptr = tiled.ptr.cpu().numpy().astype(np.int64)
    tiles = len(ptr) - 1
    if not 1 <= ctas <= tiles:
        raise ValueError(f"{ctas} CTAs for {tiles} tiles: each CTA takes at least one")
    cost = np.zeros(tiles + 1, dtype=np.int64)
    cost[1:] = ptr[1:] + TILE_COST_WORDS * np.arange(1, tiles + 1)
    targets = cost[-1] * np.arange(ctas + 1) / ctas
    bounds = np.searchsorted(cost, targets, side="left").clip(0, tiles)
    # every CTA at least one tile (ctas <= tiles): a row tile's CTAs are then consecutive, and
    # so are their partials' slots
    bounds[0], bounds[-1] = 0, tiles
    for c in range(1, ctas):
        bounds[c] = max(bounds[c], bounds[c - 1] + 1)
    for c in range(ctas - 1, 0, -1):
        bounds[c] = min(bounds[c], bounds[c + 1] - 1)
    row_split = np.zeros((tiled.row_tiles, 2), dtype=np.int64)
    row_split[:, 0] = ctas
    for c in range(ctas):
        lo, hi = bounds[c], bounds[c + 1]
        for rt in range(lo // tiled.k_tiles, (hi - 1) // tiled.k_tiles + 1):
            row_split[rt, 0] = min(row_split[rt, 0], c)
            row_split[rt, 1] += 1
    device = tiled.ptr.device
    return (torch.tensor(bounds, dtype=torch.int32, device=device),
            torch.tensor(row_split, dtype=torch.int32, device=device), int(np.diff(bounds).max()))
