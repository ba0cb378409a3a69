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
Where a class runs out before the row does, its later slots (holes) take the longer classes'
last columns, and only those read off their bank position (`_slots`); padding takes residues its
quarter-warp leaves free (`_spread_padding`): 1.05-1.18 shared-memory wavefronts a quarter-warp
and slot on 90% weights, against 1.4 when all of a row's later slots shifted (LOG, session 23).
Built once per weight, values and pattern, and memoised on the CSR object.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import CSR, memo

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
    if R % P:
        raise ValueError(f"a group of {R} rows must hold whole quarter-warps of {P} rows")
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
    team = (s * G + g) * R + t
    per_team = torch.bincount(team, minlength=S * G * R).view(S * G, R)
    chunks = -(-per_team.amax(1) // (U * Q)) * Q  # 16-byte loads per row in each block
    j = _slots(team, (res - t % P) % P, rank, (chunks * U).repeat_interleave(R), local, P)
    order = torch.argsort(team * (KS + P) + j)
    j = j[order]
    sizes = chunks * U * R
    offsets = torch.zeros(S * G + 1, dtype=torch.long, device=dev)
    offsets[1:] = torch.cumsum(sizes, 0)
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise ValueError(f"the sliced ELL copy would hold {total} words, more than int32 offsets address")
    # every word starts as padding (value 0); _spread_padding points it at a free zero row
    words = torch.zeros(total, dtype=torch.long, device=dev)
    # the nonzeros
    b = (s * G + g)[order]
    where = offsets[b] + (j // U) * (U * R) + t[order] * U + j % U
    bits = A.values.view(torch.int16).long() & 0xFFFF
    words[where] = (local[order] << 16) | bits[order]
    pad = torch.ones(total, dtype=torch.bool, device=dev)
    pad[where] = False
    _spread_padding(words, pad, R, KS, P)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    rows = torch.full((G * R,), -1, dtype=torch.int32, device=dev)
    rows[:M] = A.row_order
    return SlicedELL(words.contiguous(), offsets.to(torch.int32), rows, G, S)


def _slots(team: torch.Tensor, k: torch.Tensor, rank: torch.Tensor, length: torch.Tensor, local: torch.Tensor,
           P: int) -> torch.Tensor:
    """Each nonzero's slot j < L in its team's row of L = length[team] slots (the block's, padding
    included): slot j belongs to class k = j mod P (the row's residues rotated by its team), whose
    rank-r column takes slot rP + k while the class has columns and slots. A longer class's columns
    past its slots take the last slots that shorter classes leave empty (holes), in column order,
    where the quarter-warp's other rows are most often padding; the holes left over are padding.
    So only those columns read off their bank position, not every slot after the first class runs
    out (LOG, session 23)."""
    cls = torch.arange(length.numel() * P, device=team.device)  # (team, class) = team * P + class
    slots = (length.repeat_interleave(P) - cls % P + P - 1) // P  # each class's slots in its row
    mine = team * P + k
    on = rank < slots[mine]
    j = rank * P + k
    # holes: ranks count .. slots - 1 of each (team, class), in slot order within each team
    counts = torch.bincount(mine, minlength=cls.numel())
    holes = (slots - counts).clamp(min=0)
    owner = torch.repeat_interleave(cls, holes)
    first = torch.cumsum(holes, 0) - holes
    hole_j = (counts[owner] + torch.arange(owner.numel(), device=team.device) - first[owner]) * P + owner % P
    by_slot = torch.argsort((owner // P) * (1 << 32) + hole_j)
    hole_team, hole_j = owner[by_slot] // P, hole_j[by_slot]
    # each team's last holes, as many as it has columns past their class's slots
    extra = (~on).nonzero().squeeze(1)
    wanted = torch.bincount(team[extra], minlength=length.numel())
    from_end = torch.bincount(hole_team, minlength=length.numel())[hole_team] - 1 - _rank_within_sorted(hole_team)
    used = from_end < wanted[hole_team]
    extra = extra[torch.argsort(team[extra] * (1 << 32) + local[extra])]
    j[extra] = hole_j[used]
    return j


def _spread_padding(words: torch.Tensor, pad: torch.Tensor, R: int, KS: int, P: int) -> None:
    """Point each padding slot (in place) at a zero row of a residue that no real column of its
    quarter-warp's P rows reads at that slot, so padding never adds to a bank conflict."""
    U = SLOTS_PER_LOAD
    w = words.view(-1, R, U).transpose(1, 2).reshape(-1, P)  # rows: (chunk, slot, quarter); P rows each
    is_pad = pad.view(-1, R, U).transpose(1, 2).reshape(-1, P)
    residue = (w >> 16) % P
    used = torch.zeros(is_pad.shape, dtype=torch.int32, device=w.device).scatter_add_(1, residue, (~is_pad).int()) > 0
    # free residues first (ascending), then the used ones; the i-th padding row takes the i-th
    free = torch.argsort(used.to(torch.int8) * P + torch.arange(P, device=w.device), dim=1)
    nth = torch.cumsum(is_pad, 1) - 1
    chosen = torch.gather(free, 1, nth.clamp(min=0))
    w = torch.where(is_pad, (KS + chosen) << 16, w)
    words.copy_(w.view(-1, U, R).transpose(1, 2).reshape(-1))


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
