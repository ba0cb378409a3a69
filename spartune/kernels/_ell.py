"""CSR as a banded ELL copy (sliced ELL, the slices grouped into a few bands): the row paths'
layout for decode, where a dependent load of the row pointers before the first index load
costs a DRAM round trip per call (benchmarks/LOG.md, "CSR decode at N = 1").

Rows are sorted longest first and cut into at most ELL_BANDS bands of whole granules
(ELL_GRANULE rows); every row of a band is padded to the band's longest row (rounded up to
ELL_WIDTH_STEP), padding entries hold column `cols` (a sentinel: past the last column) and
value 0. A program's rows therefore sit at an address it computes from a handful of scalars
(the band table, passed as kernel arguments): the index and value loads start at once.
Padding costs ~2-4% more bytes on uniform random masks; the first band holds only the longest
granule, so one very long row pads 32 rows, not all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..formats import CSR, memo, unit_of_items

ELL_BANDS = 8
ELL_GRANULE = 32  # rows per band boundary: every block_m of the ell path divides it
ELL_WIDTH_STEP = 16  # band widths are multiples of 16 (aligned rows, stable kernel specialization)

_WIDTH_STEP = tl.constexpr(ELL_WIDTH_STEP)  # the same, for the kernels
_ELL_KEY = "_spartune_banded_ell"  # memoised on the CSR object; holds values, so not a pattern cache


@dataclass(frozen=True)
class BandedELL:
    cols: torch.Tensor  # A.col's dtype, (entries,): padding holds the sentinel column A.shape[1]
    values: torch.Tensor  # A.values' dtype, (entries,): padding holds 0
    rows: torch.Tensor  # int32 (rows,): the row at each position of the longest-first order
    bands: tuple  # (first position of bands 1..ELL_BANDS-1, widths of bands 0..ELL_BANDS-1)
    entries: int  # stored entries, padding included (memo() rebuilds it when A's values change)


def band_layout(lengths_desc: list[int], rows: int) -> tuple[list[int], list[int], list[int]]:
    """For row lengths sorted longest first: each band's first position, width and first entry,
    and (last) the entries of all bands. Band 0 is the first granule; the other granules split
    evenly over the rest."""
    g = ELL_GRANULE
    granules = -(-rows // g)
    cuts = sorted({0} | {1 + round(i * (granules - 1) / (ELL_BANDS - 1)) for i in range(ELL_BANDS - 1)})
    starts = [c * g for c in cuts if c < granules] or [0]
    widths = [-(-lengths_desc[p] // ELL_WIDTH_STEP) * ELL_WIDTH_STEP if p < rows else 0 for p in starts]
    bases = [0]
    for p, end, w in zip(starts, starts[1:] + [granules * g], widths):  # the last band ends past the rows
        bases.append(bases[-1] + (end - p) * w)
    return starts, widths, bases


def banded_ell(A: CSR) -> BandedELL:
    """Built with a few torch ops (one host sync for the band table) on first use and memoised
    on the format object until its values change in place."""
    return memo(A, _ELL_KEY, lambda: _build(A))


def _build(A: CSR) -> BandedELL:
    rows, ncols = A.shape
    dev = A.crow.device
    lengths = A.row_lengths().long()
    order = torch.argsort(lengths, descending=True, stable=True)
    starts, widths, bases = band_layout(lengths[order].tolist(), rows)
    entries = bases[-1]
    if entries >= 2**31:
        raise ValueError(f"banded ELL would hold {entries} entries, over int32 offsets")
    nnz = A.col.numel()
    position = torch.empty(rows, dtype=torch.long, device=dev)
    position[order] = torch.arange(rows, device=dev)
    row_of = unit_of_items(A.crow)
    pos = position[row_of]
    t_starts = torch.tensor(starts, device=dev)
    band = torch.searchsorted(t_starts, pos, right=True) - 1
    first_entry = torch.tensor(bases[:-1], device=dev)[band]
    width = torch.tensor(widths, device=dev)[band]
    dest = first_entry + (pos - t_starts[band]) * width + torch.arange(nnz, device=dev) - A.crow[:-1].long()[row_of]
    cols = torch.full((max(entries, 1),), ncols, dtype=A.col.dtype, device=dev)
    vals = torch.zeros(max(entries, 1), dtype=A.values.dtype, device=dev)
    cols[dest] = A.col
    vals[dest] = A.values
    # unused bands start past the last position (never taken) and are empty
    pad = -(-rows // ELL_GRANULE) * ELL_GRANULE
    table = tuple(starts[1:]) + (pad,) * (ELL_BANDS - len(starts)) + tuple(widths) + (0,) * (ELL_BANDS - len(widths))
    return BandedELL(cols, vals, order.to(torch.int32), table, entries)


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
    pos = first + tl.arange(0, R)  # positions in the longest-first order
    valid = pos < M
    rows = tl.load(rows_ptr + pos, mask=valid, other=0)
    start = tl.multiple_of(base + (pos - band_start) * width, _WIDTH_STEP)
    length = tl.where(valid, width, 0)
    return rows, valid, start, length, width
