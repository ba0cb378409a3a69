"""CSR as a bitmap, and its expansion into dense tiles inside a kernel: shared by the dense
SpMM paths (spmm_csr "dense" and "expand") and SDDMM's dense path."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..formats import CSR
from ..formats import PATTERN_CACHES, unit_of_items
from ._common import INTERPRETED

# ALU work of the dense path's expansion per dense element of a tile, in flop-equivalents
# (2 per instruction, as an FMA counts 2): ~14 SASS instructions per element on sm_90 (bit test,
# popc, add, 64-bit address, predicated gather, store to shared memory for the MMA).
EXPAND_FLOPS_PER_ELEMENT = 28.0

_BITMAP_KEY = "_spartune_csr_bitmap"
PATTERN_CACHES.add(_BITMAP_KEY)  # the pattern's, not the values': new values keep it


def csr_bitmap(A: CSR) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits, word_offsets), each int32 (rows, ceil(cols / 32)).

    bits[r, w] bit j is set when A stores (r, 32w + j); word_offsets[r, w] is the index in
    A.values of the first nonzero of row r at or after column 32w. Built with a few torch ops
    on first use and memoised on the (immutable) format object, so a call costs nothing.
    """
    cached = A.__dict__.get(_BITMAP_KEY)
    if cached is not None:
        return cached
    rows, cols = A.shape
    kw = max(1, -(-cols // 32))
    dev = A.crow.device
    nnz = A.col.numel()
    r = unit_of_items(A.crow, nnz)
    c = A.col.long()
    word = r * kw + (c >> 5)
    bits64 = torch.zeros(rows * kw, dtype=torch.int64, device=dev)
    bits64.index_add_(0, word, torch.ones_like(c) << (c & 31))  # distinct bits: sum == or
    bits = torch.where(bits64 >= 2**31, bits64 - 2**32, bits64).to(torch.int32).view(rows, kw)
    counts = torch.zeros(rows * kw, dtype=torch.int64, device=dev)
    counts.index_add_(0, word, torch.ones_like(c))
    counts = counts.view(rows, kw)
    woff = (A.crow[:-1, None].long() + torch.cumsum(counts, 1) - counts).to(torch.int32)
    out = (bits.contiguous(), woff.contiguous())
    object.__setattr__(A, _BITMAP_KEY, out)
    return out


def drop_csr_bitmap(A: CSR) -> None:
    """Forget A's bitmap (built again on next use)."""
    A.__dict__.pop(_BITMAP_KEY, None)


# Triton's interpreter (CPU tests) has no popc; it runs the same arithmetic with a SWAR popcount.
HW_POPC = not INTERPRETED


@triton.jit
def _popc(x, HW: tl.constexpr):
    """Set bits of each int32."""
    if HW:
        return libdevice.popc(x)
    else:
        x = x - ((x >> 1) & 0x55555555)  # the masks make the arithmetic shifts safe
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return (x * 0x01010101) >> 24


@triton.jit
def expand_chunk(bits_row, base, k0, KW, rvalid, BM: tl.constexpr, BK: tl.constexpr, HW: tl.constexpr):
    """Where the stored entries of a (BM, BK) chunk starting at column k0 (a multiple of 32) are.

    Returns (bit, idx, count): bit (BM, BK) is True where an entry is stored, idx its index in
    `values` (row offset `base` + entries in earlier words + popc of the word's bits up to the
    element - 1), count (BM,) the entries of the chunk per row. Per element: an and, a popc,
    an add, a bit test (about 14 SASS instructions per element with the gather, vs ~21 with a
    prefix scan, which Triton lowers through shared memory).
    """
    W: tl.constexpr = BK // 32
    wi = k0 // 32 + tl.arange(0, W)
    w = tl.load(bits_row[:, None] + wi[None, :], mask=rvalid[:, None] & (wi < KW)[None, :], other=0)  # (BM, W)
    cnt = _popc(w, HW)
    start = base[:, None] + tl.cumsum(cnt, axis=1) - cnt - 1  # (BM, W): entries before the word, minus one
    b = tl.arange(0, 32)
    w3 = w[:, :, None]
    bit = (w3 & (1 << b)[None, None, :]) != 0
    idx = start[:, :, None] + _popc(w3 & ((2 << b) - 1)[None, None, :], HW)  # (2 << 31) - 1 wraps to all ones
    return tl.reshape(bit, (BM, BK)), tl.reshape(idx, (BM, BK)), tl.sum(cnt, axis=1)
