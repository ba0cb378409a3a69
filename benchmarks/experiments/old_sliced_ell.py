"""The sliced, slot-major ELL copy of a CSR weight that the csr_smem family streams.

Rows are taken in `A.row_order` (longest first) in groups of R (one warp's rows) and K is cut
in slices of KS columns (one CTA's shared-memory copy of x). Blocks are stored slice by slice,
so the consecutive groups a warp serves in one slice are one contiguous stream. For each block,
slot j of every row of the group lies side by side, 4 slots per row at a time, so a warp reads
its R rows' next 4 nonzeros with one coalesced 16-byte load per lane:

    word (block, chunk c, row t, u) holds slot 4c + u of row t,   word = column in slice << 16 | value bits

Rows shorter than the block's longest are padded with zero values pointing at one of P zero
rows kept past the slice in shared memory. The slots of a row are ordered so that, at each slot,
the P rows that one quarter of a warp serves (teams t = iP .. iP + P - 1) read columns in
different residues mod P (the kernel's plane pitch then puts each row's lanes on the remaining
16-byte bank positions of the staged x): row t takes,
at round r, its r-th column of residue (t + j) mod P for slot j = rP + ((residue - t) mod P).
That holds while every residue class of a row still has columns; the tail may conflict.
Built once per weight, values and pattern, and memoised on the CSR object.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spartune.formats import CSR, memo

SLOTS_PER_LOAD = 4  # 32-bit words per lane and 16-byte load


@dataclass(frozen=True)
class SlicedELL:
    words: torch.Tensor  # int32 (total,): the blocks one after another, (slice, group) order
    offsets: torch.Tensor  # int32 (slices * groups + 1,): where each block starts, in words
    rows: torch.Tensor  # int32 (groups * R,): the row behind each team; -1 past the last row
    groups: int
    slices: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.words, self.offsets, self.rows))


def sliced_ell(A: CSR, rows_per_group: int, k_slice: int, phases: int, lanes_per_row: int = 1) -> SlicedELL:
    """A's sliced ELL for R = rows_per_group rows per group, slices of k_slice columns and
    `phases` (P) bank positions, memoised on A. With `lanes_per_row` > 1 lanes splitting each
    row's chunks (chunk q, q + lanes, ...), a block holds a multiple of that many chunks."""
    key = memo_key(rows_per_group, k_slice, phases, lanes_per_row)
    return memo(A, key, lambda: _build(A, rows_per_group, k_slice, phases, lanes_per_row))


def drop_sliced_ell(A: CSR, keep: set[str] = frozenset()) -> None:
    """Forget the copies whose memo keys are not in `keep`."""
    for key in [k for k in A.__dict__ if k.startswith("_sliced_ell_") and k not in keep]:
        del A.__dict__[key]


def memo_key(rows_per_group: int, k_slice: int, phases: int, lanes_per_row: int = 1) -> str:
    return f"_sliced_ell_{rows_per_group}_{k_slice}_{phases}_{lanes_per_row}"


def _build(A: CSR, R: int, KS: int, P: int, Q: int) -> SlicedELL:
    M, K = A.shape
    if A.values.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"csr_smem runs fp16 / bf16 weights, got {A.values.dtype}")
    if KS % P or KS + P > 1 << 16:
        raise ValueError(f"a slice of {KS} columns must be a multiple of {P} and below 65536 - {P}")
    dev = A.values.device
    U = SLOTS_PER_LOAD
    G, S = -(-M // R), max(1, -(-K // KS))
    counts = (A.crow[1:] - A.crow[:-1]).long()
    row = torch.repeat_interleave(torch.arange(M, device=dev), counts)
    col = A.col.long()
    pos = torch.empty(M, dtype=torch.long, device=dev)
    pos[A.row_order.long()] = torch.arange(M, device=dev)
    p = pos[row]
    g, t = p // R, p % R
    s = col // KS
    local = col - s * KS
    res = local % P
    # rank of each nonzero within its (row, slice, residue) class, in column order (CSR rows are
    # sorted by column and the sort is stable)
    bucket = (row * S + s) * P + res
    rank = _rank_within(bucket)
    slot_key = rank * P + (res - t % P) % P
    # final order: block (s, g), team t, slot key; j = index within (s, g, t)
    team = (s * G + g) * R + t
    order = torch.argsort(team * (KS + P) + slot_key, stable=True)
    team_sorted = team[order]
    j = _rank_within_sorted(team_sorted)
    per_team = torch.bincount(team, minlength=S * G * R).view(S * G, R)
    chunks = -(-per_team.amax(1) // (U * Q)) * Q  # 16-byte loads per row in each block
    sizes = chunks * U * R
    offsets = torch.zeros(S * G + 1, dtype=torch.long, device=dev)
    offsets[1:] = torch.cumsum(sizes, 0)
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise ValueError(f"the sliced ELL copy would hold {total} words, more than int32 offsets address")
    # every word starts as padding: value 0, a zero row of the slot's own bank position
    block = torch.repeat_interleave(torch.arange(S * G, device=dev), sizes)
    within = torch.arange(total, device=dev) - offsets[block]
    pad_t = (within % (U * R)) // U
    pad_j = (within // (U * R)) * U + within % U
    words = (KS + (pad_t % P + pad_j) % P) << 16
    # the nonzeros
    b = (s * G + g)[order]
    where = offsets[b] + (j // U) * (U * R) + t[order] * U + j % U
    bits = A.values.view(torch.int16).long() & 0xFFFF
    words[where] = (local[order] << 16) | bits[order]
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    rows = torch.full((G * R,), -1, dtype=torch.int32, device=dev)
    rows[:M] = A.row_order
    return SlicedELL(words.contiguous(), offsets.to(torch.int32), rows, G, S)


def _rank_within(key: torch.Tensor) -> torch.Tensor:
    """For each element, how many earlier elements (in index order) share its key."""
    order = torch.argsort(key, stable=True)
    ranks = torch.empty_like(key)
    ranks[order] = _rank_within_sorted(key[order])
    return ranks


def _rank_within_sorted(sorted_key: torch.Tensor) -> torch.Tensor:
    """Ranks within runs of equal values of a sorted tensor."""
    n = sorted_key.numel()
    idx = torch.arange(n, device=sorted_key.device)
    if n == 0:
        return idx
    starts = torch.ones(n, dtype=torch.bool, device=sorted_key.device)
    starts[1:] = sorted_key[1:] != sorted_key[:-1]
    first = torch.cummax(torch.where(starts, idx, torch.zeros_like(idx)), 0).values
    return idx - first


def to_dense(ell: SlicedELL, shape: tuple[int, int], k_slice: int, dtype: torch.dtype) -> torch.Tensor:
    """The (M, K) matrix a sliced ELL copy holds, read the way the kernel reads it (padding
    slots, which point past the slice, add nothing): the layout's inverse, for tests."""
    M, K = shape
    R = ell.rows.numel() // ell.groups
    U = SLOTS_PER_LOAD
    sizes = (ell.offsets[1:] - ell.offsets[:-1]).long()
    block = torch.repeat_interleave(torch.arange(ell.slices * ell.groups, device=sizes.device), sizes)
    within = torch.arange(ell.words.numel(), device=sizes.device) - ell.offsets[:-1].long()[block]
    s, g = block // ell.groups, block % ell.groups
    t = (within % (U * R)) // U
    words = ell.words.long() & 0xFFFFFFFF
    local, bits = words >> 16, words & 0xFFFF
    real = local < k_slice
    row = ell.rows.long()[g * R + t]
    col = s * k_slice + local
    if bool((row[real] < 0).any()) or bool((col[real] >= K).any()):
        raise ValueError("a stored word points outside the matrix")
    values = bits[real].to(torch.int16).view(dtype)
    dense = torch.zeros(M, K, dtype=torch.float64, device=sizes.device)
    dense.index_put_((row[real], col[real]), values.double(), accumulate=True)
    return dense
