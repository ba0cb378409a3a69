"""CSR as a banded ELL copy (sliced ELL, the slices grouped into a few bands): the row paths'
layout for decode, where a dependent load of the row pointers before the first index load
costs a DRAM round trip per call (benchmarks/LOG.md, "CSR decode at N = 1").

Rows are sorted longest first and cut into at most ELL_BANDS bands of whole granules
(ELL_GRANULE rows); every row of a band is padded to the band's longest row (rounded up to
ELL_WIDTH_STEP), padding entries hold column `cols` (a sentinel: past the last column) and
value 0. A program's rows therefore sit at an address it computes from a handful of scalars
(the band table, passed as kernel arguments): the index and value loads start at once.
Padding costs ~2-3% more bytes on uniform random masks; the first band holds only the longest
granule, so one very long row pads 32 rows, not all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..formats import CSR

ELL_BANDS = 8
ELL_GRANULE = 32  # rows per band boundary: every block_m of the ell path divides it
ELL_WIDTH_STEP = 16  # band widths are multiples of 16 (aligned rows, stable kernel specialization)

_WIDTH_STEP = tl.constexpr(ELL_WIDTH_STEP)  # the same, for the kernels
_ELL_KEY = "_spartune_banded_ell"  # memoised on the CSR object; holds values, so not a pattern cache


@dataclass(frozen=True)
class BandedELL:
    cols: torch.Tensor  # A.col's dtype, (slots,): sentinel = number of columns
    values: torch.Tensor  # A.values' dtype, (slots,)
    rows: torch.Tensor  # int32 (rows,): the row held by each slot, longest first
    bands: tuple  # (first slot of bands 1..ELL_BANDS-1, widths of bands 0..ELL_BANDS-1)
    padded: int  # slots, padding included


def padded_slots(lengths_desc: list[int], rows: int) -> tuple[list[int], list[int], int]:
    """Band starts (slots) and widths for row lengths sorted longest first, and the slots they
    occupy: band 0 is the first granule, the other granules split evenly over the rest."""
    g = ELL_GRANULE
    granules = -(-rows // g)
    cuts = sorted({0} | {1 + round(i * (granules - 1) / (ELL_BANDS - 1)) for i in range(ELL_BANDS - 1)})
    cuts = [c for c in cuts if c < granules] if granules else [0]
    starts = [c * g for c in cuts]
    widths = [-(-lengths_desc[s] // ELL_WIDTH_STEP) * ELL_WIDTH_STEP if s < rows else 0 for s in starts]
    ends = starts[1:] + [granules * g]
    return starts, widths, sum((e - s) * w for s, e, w in zip(starts, ends, widths))


def banded_ell(A: CSR) -> BandedELL:
    """Built with a few torch ops (one host sync for the band table) on first use and memoised
    on the (immutable) format object."""
    cached = A.__dict__.get(_ELL_KEY)
    if cached is not None:
        return cached
    rows, ncols = A.shape
    dev = A.crow.device
    lengths = (A.crow[1:] - A.crow[:-1]).long()
    order = torch.argsort(lengths, descending=True, stable=True)
    starts, widths, slots = padded_slots(lengths[order].tolist(), rows)
    if slots >= 2**31:
        raise ValueError(f"banded ELL would hold {slots} slots, over int32 offsets")
    g = ELL_GRANULE
    pad_rows = -(-rows // g) * g
    bases = [0]
    for s, e, w in zip(starts, starts[1:] + [pad_rows], widths):
        bases.append(bases[-1] + (e - s) * w)
    nnz = A.col.numel()
    slot_of_row = torch.empty(rows, dtype=torch.long, device=dev)
    slot_of_row[order] = torch.arange(rows, device=dev)
    row_of = torch.repeat_interleave(torch.arange(rows, device=dev), lengths, output_size=nnz)
    slot = slot_of_row[row_of]
    t_starts = torch.tensor(starts, device=dev)
    band = torch.searchsorted(t_starts, slot, right=True) - 1
    dest = (torch.tensor(bases[:-1], device=dev)[band] + (slot - t_starts[band]) * torch.tensor(widths, device=dev)[band]
            + torch.arange(nnz, device=dev) - A.crow[:-1].long()[row_of])
    cols = torch.full((max(slots, 1),), ncols, dtype=A.col.dtype, device=dev)
    vals = torch.zeros(max(slots, 1), dtype=A.values.dtype, device=dev)
    cols[dest] = A.col
    vals[dest] = A.values
    # unused bands start past the last slot (never taken) and are empty
    table = (tuple(starts[1:]) + (pad_rows,) * (ELL_BANDS - len(starts)),
             tuple(widths) + (0,) * (ELL_BANDS - len(widths)))
    out = BandedELL(cols, vals, order.to(torch.int32), table[0] + table[1], slots)
    object.__setattr__(A, _ELL_KEY, out)
    return out


def drop_banded_ell(A: CSR) -> None:
    """Forget A's banded ELL copy (built again on next use)."""
    A.__dict__.pop(_ELL_KEY, None)


@triton.jit
def banded_rows(block, rows_ptr, M, bands, R: tl.constexpr, NB: tl.constexpr):
    """The R rows of row block `block` in the banded ELL layout: their indices, which are real,
    where each starts in the padded arrays, its padded length and the longest of them (its
    band's width, a scalar: no reduction before the loop). Only the row indices are loaded
    (for the output); the rest comes from the band table."""
    first = block * R
    base = 0
    run = 0
    band_start = 0
    width = bands[NB - 1]  # band 0's width (bands = starts of bands 1.., widths of bands 0..)
    prev_start = 0
    prev_width = bands[NB - 1]
    for b in tl.static_range(1, NB):
        s_b = bands[b - 1]
        w_b = bands[NB - 1 + b]
        run += (s_b - prev_start) * prev_width  # where band b starts in the arrays
        take = first >= s_b
        base = tl.where(take, run, base)
        band_start = tl.where(take, s_b, band_start)
        width = tl.where(take, w_b, width)
        prev_start = s_b
        prev_width = w_b
    slot = first + tl.arange(0, R)
    valid = slot < M
    rows = tl.load(rows_ptr + slot, mask=valid, other=0)
    start = tl.multiple_of(base + (slot - band_start) * width, _WIDTH_STEP)
    length = tl.where(valid, width, 0)
    return rows, valid, start, length, width
