"""What `mma.sp.sync.aligned.m16n8k32.row.col.f32.{f16,bf16}` computes, in float64 torch, from
the registers of a warp: so CPU tests can check the host-side packing (sparse_mma.py) and GPU
tests can check the hardware against the same decoding.

Written from the PTX ISA's per-element formulas (lane, register -> row, column) rather than
from the packer's reshapes, so the two are independent. With sparsity selector F, lanes
4g + 2F and 4g + 2F + 1 supply the metadata of rows g and g + 8.
"""
from __future__ import annotations

import torch

LANES = 32


def _fragment_coordinates():
    """For each (lane, half i) of the A values: its row and compressed column."""
    lane = torch.arange(LANES).view(LANES, 1)
    i = torch.arange(8).view(1, 8)
    g, t = lane // 4, lane % 4
    row = torch.where((i < 2) | ((i >= 4) & (i < 6)), g, g + 8)
    col = torch.where(i < 4, 2 * t + (i & 1), 2 * t + 8 + (i & 1))
    return row, col


def decode(values: torch.Tensor, meta: torch.Tensor, selector: int = 0) -> torch.Tensor:
    """Register-order values (..., 32, 8) and metadata (..., 32) -> the dense A tiles
    (..., 16, 32) in float64 that the instruction multiplies."""
    if values.shape[-2:] != (LANES, 8) or meta.shape != values.shape[:-1]:
        raise ValueError(f"values must be (..., 32, 8) and meta (..., 32), "
                         f"got {tuple(values.shape)} and {tuple(meta.shape)}")
    if selector not in (0, 1):
        raise ValueError("the sparsity selector of m16n8k32 f16/bf16 is 0 or 1")
    row, col = _fragment_coordinates()  # (32, 8) each: compressed coordinates
    group = col // 2  # 8 groups of 4 dense columns
    owner = 4 * (row % 8) + 2 * selector + group // 4  # the lane holding this entry's position
    shift = 16 * (row // 8) + 4 * (group % 4) + 2 * (col % 2)
    words = meta.to(torch.int64) & 0xFFFFFFFF
    held = words[..., owner.flatten()].reshape(*meta.shape[:-1], LANES, 8)
    pos = (held >> shift) & 3
    # the two positions of a group must differ and increase, as the instruction requires
    first = (held >> (shift - 2 * (col % 2))) & 3
    second = (held >> (shift - 2 * (col % 2) + 2)) & 3
    if bool((second <= first).any()):
        raise ValueError("invalid metadata: a group's two positions must be distinct and increasing")
    dense = torch.zeros(*values.shape[:-2], 16, 32, dtype=torch.float64, device=values.device)
    flat_index = (row * 32 + 4 * group + pos).reshape(*values.shape[:-2], LANES * 8)
    dense.view(*values.shape[:-2], 16 * 32).scatter_(-1, flat_index, values.to(torch.float64).reshape(flat_index.shape))
    return dense


def mma_sp_m16n8k32(values, meta, b, c=None, selector: int = 0) -> torch.Tensor:
    """D = A B + C for one warp's instruction (or a batch of them): A from register-order
    values (..., 32, 8) and metadata (..., 32), B dense (..., 32, 8), C (..., 16, 8) or none.
    Float64: the hardware's fp32 accumulation differs from it only by rounding."""
    d = decode(values, meta, selector) @ b.to(torch.float64)
    return d if c is None else d + c.to(torch.float64)


def decode_matrix(values: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """Packed tiles (M/16, K/32, 32, 8) and (M/16, K/32, 32) -> the dense (M, K) float64 matrix."""
    tiles = decode(values, meta)  # (mt, kt, 16, 32)
    mt, kt = tiles.shape[:2]
    return tiles.permute(0, 2, 1, 3).reshape(mt * 16, kt * 32)
