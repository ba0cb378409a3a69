"""Host-side layout of 2:4 weights for the sparse tensor cores: the values and metadata of
`mma.sp.sync.aligned.m16n8k32` (f16/bf16, sparsity selector 0) in the order each lane of a warp
holds them in its registers, so a kernel loads them with one 16-byte and one 4-byte load per
lane and issues the instruction with no shuffling. Built once per weight; the tests check it
against `emulate.py`, which decodes the same registers as the PTX ISA describes them.

A tile is 16 rows x 32 columns of the dense weight (8 groups of 4 columns per row, 2 kept per
group), stored compressed as 16 x 16 values plus a 2-bit position per value.

Registers of lane L (g = L // 4, t = L % 4), from the PTX ISA's fragment layout:
- values: 8 halves h[0..7] (4 x .b32); h[i] is compressed entry (row g + 8 * (i // 2 % 2),
  column 2t + i % 2 + 8 * (i // 4)), i.e. four 8x8 quadrants (row half, column half) in the
  order (top-left, bottom-left, top-right, bottom-right);
- metadata: one .b32. Lanes with t = 0 and 1 supply it (selector 0): lane 4g + h holds, in bits
  0..15, row g's positions for groups 4h..4h+3 and in bits 16..31 row g + 8's; a group's two
  positions take 4 bits (first kept position in the low 2 bits, the positions increasing).
  Lanes t = 2 and 3 repeat the words of t = 0 and 1, so the words also serve selector 1.
"""
from __future__ import annotations

import torch

from ...formats.nm import pick_positions, tile_order

TILE_M, TILE_K = 16, 32  # one instruction's A: 16 rows x 32 dense columns
LANES = 32
HALVES_PER_LANE = 8
DTYPES = (torch.float16, torch.bfloat16)


def pack_compressed(values: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K/2) kept values and their positions (0..3 inside each group of 4 columns, two per
    group, increasing) -> (M/16, K/32, 32, 8) values in register order and (M/16, K/32, 32)
    int32 metadata words. M must be a multiple of 16 and K of 32 (the caller pads)."""
    pairs, mt, kt = _checked(values, idx)
    # values: (mt, row half, g, kt, col half, t, pair) -> (mt, kt, g, t, col half, row half, pair)
    v = values.reshape(mt, 2, 8, kt, 2, 4, 2).permute(0, 3, 2, 5, 4, 1, 6)
    return v.reshape(mt, kt, LANES, HALVES_PER_LANE).contiguous(), _metadata(pairs, mt, kt)


def pack_core_matrices(values: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As `pack_compressed`, but each (16-row tile, K step)'s 16 x 16 kept values as 8 x 8 core
    matrices, (M/16, K/32, row half, column half, row, 8 values): how wgmma.sp reads A from shared
    memory and ldmatrix hands mma.sp its fragment (kernels/spmm_nm.py's one packing)."""
    pairs, mt, kt = _checked(values, idx)
    return tile_order(values, mt, kt).view(mt, kt, 2, 2, 8, 8), _metadata(pairs, mt, kt)


def metadata_words(idx: torch.Tensor) -> torch.Tensor:
    """(M, K/2) positions -> the (M/16, K/32, 32) metadata words of `pack_compressed`, for values
    already in place (spmm_nm's PackedNM and PackedVNM)."""
    return _metadata(*_pairs(idx))


def _checked(values: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The positions as (M, K/4, 2) pairs, and the tiles (M/16, K/32), once the operands are valid."""
    if values.dim() != 2 or values.shape != idx.shape:
        raise ValueError(f"values and idx must be 2-D of one shape, "
                         f"got {tuple(values.shape)} and {tuple(idx.shape)}")
    return _pairs(idx)


def _pairs(idx: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """`_checked`'s positions and tiles, from the positions alone."""
    if idx.dim() != 2:
        raise ValueError(f"idx must be 2-D (M, K/2), got {tuple(idx.shape)}")
    rows, kept = idx.shape
    if rows % TILE_M or kept % (TILE_K // 2):
        raise ValueError(f"values must be (M, K/2) with M a multiple of {TILE_M} and K of {TILE_K}, "
                         f"got {tuple(idx.shape)}")
    pos = idx.to(torch.int64)
    if pos.numel() and bool(((pos < 0) | (pos > 3)).any()):
        raise ValueError("idx must hold positions 0..3")
    pairs = pos.reshape(rows, kept // 2, 2)
    if pairs.numel() and bool((pairs[..., 1] <= pairs[..., 0]).any()):
        raise ValueError("idx must be strictly increasing within each group (two distinct positions)")
    return pairs, rows // TILE_M, kept // (TILE_K // 2)


def _metadata(pairs: torch.Tensor, mt: int, kt: int) -> torch.Tensor:
    """(M, K/4, 2) positions -> (M/16, K/32, 32) int32 words in mma.sp's register order."""
    # one nibble per group, (mt, row half, g, kt, h, q) -> word (mt, kt, g, h)
    nibble = pairs[..., 0] | (pairs[..., 1] << 2)  # (rows, K/4)
    n = nibble.reshape(mt, 2, 8, kt, 2, 4).permute(0, 3, 2, 4, 1, 5)  # (mt, kt, g, h, row half, q)
    shift = 16 * torch.arange(2).view(2, 1) + 4 * torch.arange(4).view(1, 4)
    word = (n << shift.to(n.device)).sum(dim=(-2, -1))  # (mt, kt, g, h), fits in 32 bits
    word = torch.cat([word, word], dim=-1)  # lanes t = 2, 3 repeat t = 0, 1
    word = torch.where(word >= 2**31, word - 2**32, word)  # as int32 bit patterns
    return word.reshape(mt, kt, LANES).to(torch.int32).contiguous()


def compress(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense 2:4 matrix (M, K), K a multiple of 4 -> (M, K/2) kept values and positions."""
    if w.dim() != 2 or w.shape[1] % 4:
        raise ValueError(f"w must be 2-D with K a multiple of 4, got {tuple(w.shape)}")
    rows, cols = w.shape
    groups = w.reshape(rows, cols // 4, 4)
    nonzero = groups != 0
    bad = nonzero.sum(-1) > 2
    if bool(bad.any()):
        r, g = (int(i) for i in torch.nonzero(bad)[0].tolist())
        raise ValueError(f"w is not 2:4 sparse: row {r}, columns {4 * g}..{4 * g + 3} hold more than 2 nonzeros")
    pos = pick_positions(nonzero, 2)
    return torch.gather(groups, 2, pos).reshape(rows, cols // 2), pos.reshape(rows, cols // 2)


def pack_dense(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense 2:4 matrix (M, K), M a multiple of 16 and K of 32 -> register-order values and
    metadata (see `pack_compressed`)."""
    if w.dtype not in DTYPES:
        raise TypeError(f"w must be float16 or bfloat16 (the sparse tensor cores' inputs), got {w.dtype}")
    values, idx = compress(w)
    return pack_compressed(values, idx)
