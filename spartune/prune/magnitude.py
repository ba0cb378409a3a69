"""Magnitude pruning into each pattern: keep the entries (blocks, columns) that carry the most
squared weight, under the pattern's constraints."""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..formats import CSR, NM, VNM, BlockSparse, ShuffledBlock
from ..formats import ceil_div, check_block_size, check_dense_weight
from .patterns import Pattern, parse_pattern


@dataclass(frozen=True)
class PruneReport:
    pattern: str
    sparsity: float  # achieved: 1 - kept entries / all entries
    retained: float  # ||pruned||_2 / ||w||_2: the fraction of weight magnitude kept


def sparsify_weight(w: torch.Tensor, pattern, sparsity: float | None = None, *, return_report: bool = False):
    """Prune a dense weight by magnitude into `pattern` and return it in that format.

    `pattern`: "csr", "block:64x64" / "block:64", "shfl:64", "2:4" (any N:M), "64:2:8" (V:N:M).
    `sparsity` is the fraction of zeros; N:M and V:N:M fix it themselves (pass None, or the
    matching value). With `return_report=True` returns (format, PruneReport). `w` is not changed,
    and the format holds no autograd history back to it (a Parameter stays the layer's own).
    """
    check_dense_weight(w)
    p = parse_pattern(pattern)
    density = _density(p, sparsity)
    w = w.detach()
    if torch.isnan(w).any():
        raise ValueError("the weight holds NaN: magnitude pruning cannot rank it (NaN would rank first); "
                         "fix or zero those entries first")
    mask, make = _PRUNERS[p.kind](_ranking_copy(w), p, density)
    pruned = torch.where(mask, w, torch.zeros((), dtype=w.dtype, device=w.device))
    fmt = make(pruned)
    if not return_report:
        return fmt
    total = w.double().norm().item()
    report = PruneReport(
        pattern=str(p),
        sparsity=1.0 - mask.sum().item() / max(1, w.numel()),
        retained=pruned.double().norm().item() / total if total > 0 else 1.0,
    )
    return fmt, report


def _ranking_copy(w: torch.Tensor) -> torch.Tensor:
    """w over its largest magnitude: the pruners rank squares and sums in float32, where a weight
    near 1e25 overflows and one near 1e-30 (or a float64 one near 1e-200) underflows to ties; the
    order of the magnitudes is the same."""
    top = w.abs().amax() if w.numel() else torch.zeros(())
    return w / top if 0 < top.item() < float("inf") else w


def _density(p: Pattern, sparsity) -> float:
    fixed = p.fixed_density
    if sparsity is not None:
        if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= sparsity <= 1.0:
            raise ValueError(f"sparsity must be a number in [0, 1], got {sparsity!r}")
        if fixed is not None and abs((1.0 - sparsity) - fixed) > 1e-6:
            raise ValueError(f"pattern {p} fixes the sparsity at {1 - fixed:g}; got sparsity={sparsity:g}")
        return 1.0 - float(sparsity)
    if fixed is None:
        raise ValueError(f"pattern {p} needs a sparsity (fraction of zeros in [0, 1])")
    return fixed


def _keep_top(scores: torch.Tensor, density: float, sizes: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean mask of the highest scores: all but round(sparsity * total size) entries, as
    torch.nn.utils.prune counts (a 1-entry layer at 50% keeps its entry, not none).

    `sizes` (entries per score; edge blocks are smaller) make the achieved sparsity exact
    where units differ in size: units are then ranked by score per entry, and a unit whose
    middle falls on the budget is kept (one 64 x 64 block at 50% stays, not pruned away).
    """
    flat = scores.reshape(-1)
    keep = torch.zeros(flat.numel(), dtype=torch.bool, device=scores.device)
    if sizes is None:
        k = flat.numel() - int(round(round(1.0 - density, 12) * flat.numel()))  # (1 - density: the sparsity given)
        if k:
            keep[torch.topk(flat, k, sorted=False).indices] = True
        return keep.reshape(scores.shape)
    sizes = sizes.reshape(-1).to(flat.device, torch.float64)
    order = torch.argsort(flat.double() / sizes.clamp_min(1), descending=True, stable=True)
    budget = density * sizes.sum().item() * (1 + 1e-12)
    reach = torch.cumsum(sizes[order], 0) - sizes[order] / 2  # keep a unit if most of it fits
    prefix = reach <= budget
    keep[order[prefix]] = True
    # past the first unit that does not fit, a smaller one (an edge block) may still: greedily,
    # in rank order (else a 100 x 70 weight at block:64 and 90% loses every block)
    rest = order[~prefix]
    if rest.numel():
        used = sizes[order[prefix]].sum().item()
        smaller = rest[sizes[rest] < sizes[rest[0]]]
        for unit, size in zip(smaller.tolist(), sizes[smaller].tolist()):
            if used + size / 2 <= budget:
                keep[unit] = True
                used += size
    return keep.reshape(scores.shape)


def _edge_sizes(rows, cols, bm, bk):
    """Entries of each (bm, bk) tile inside a rows x cols matrix."""
    r = torch.clamp(rows - torch.arange(ceil_div(rows, bm)) * bm, max=bm)
    c = torch.clamp(cols - torch.arange(ceil_div(cols, bk)) * bk, max=bk)
    return r[:, None] * c[None, :]


def _prune_csr(w, p, density):
    return _keep_top(w.abs(), density), CSR.from_dense


def _tiles(w, bm, bk):
    """(br, bm, bc, bk) view of w padded to whole tiles, in float32 squares."""
    rows, cols = w.shape
    br, bc = ceil_div(rows, bm), ceil_div(cols, bk)
    return F.pad(w.float() ** 2, (0, bc * bk - cols, 0, br * bm - rows)).reshape(br, bm, bc, bk)


def _expand(block_mask, bm, bk, shape):
    return block_mask.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[: shape[0], : shape[1]]


def _prune_block(w, p, density):
    check_block_size("bm", p.bm), check_block_size("bk", p.bk)
    keep = _keep_top(_tiles(w, p.bm, p.bk).sum((1, 3)), density, _edge_sizes(*w.shape, p.bm, p.bk))
    return _expand(keep, p.bm, p.bk, w.shape), lambda x: BlockSparse.from_dense(x, (p.bm, p.bk))


def _prune_nm(w, p, density):
    rows, cols = w.shape
    if not 1 <= p.n < p.m <= 128:
        raise ValueError(f"N:M needs 1 <= N < M <= 128, got {p.n}:{p.m}")
    groups = ceil_div(cols, p.m)
    mag = F.pad(w.abs().float(), (0, groups * p.m - cols), value=-1.0).reshape(rows, groups, p.m)
    keep = torch.zeros_like(mag, dtype=torch.bool).scatter_(2, torch.topk(mag, p.n, 2).indices, True)
    return keep.reshape(rows, groups * p.m)[:, :cols], lambda x: NM.from_dense(x, p.n, p.m)


def _prune_vnm(w, p, density):
    check_block_size("v", p.bm)
    if not 4 <= p.m <= 128:
        raise ValueError(f"V:N:M needs M in 4..128, got {p.m}")
    rows, cols = w.shape
    sq = _tiles(w, p.bm, p.m)  # (rb, v, cb, m)
    col_norm = sq.sum(1)  # (rb, cb, m)
    cols4 = torch.topk(col_norm, 4, 2).indices  # (rb, cb, 4)
    rb, v, cb, m = sq.shape
    in4 = torch.gather(sq, 3, cols4[:, None].expand(rb, v, cb, 4))
    keep4 = torch.zeros_like(in4, dtype=torch.bool).scatter_(3, torch.topk(in4, 2, 3).indices, True)
    keep = torch.zeros_like(sq, dtype=torch.bool).scatter_(3, cols4[:, None].expand(rb, v, cb, 4), keep4)
    mask = keep.reshape(rb * v, cb * m)[:rows, :cols]
    return mask, lambda x: VNM.from_dense(x, p.bm, p.m)


SHFL_CHUNK = 32  # Shfl-BW groups keep their columns in multiples of this (see _keep_chunks) ...


def shfl_chunk(cols: int) -> int:
    """... or of a smaller power of two where K has fewer than 8 such chunks: a coarse count
    would leave a small layer's groups all or nothing (and small layers are not kernel-bound)."""
    chunk = SHFL_CHUNK
    while chunk > 1 and cols < 8 * chunk:
        chunk //= 2
    return chunk


def _prune_shfl(w, p, density):
    v = check_block_size("v", p.bm)
    perm = shuffle_rows(w, v, density)
    rows, cols = w.shape
    groups = ceil_div(rows, v)
    grouped = F.pad(w.float()[perm] ** 2, (0, 0, 0, groups * v - rows)).reshape(groups, v, cols)
    rows_in = torch.clamp(rows - torch.arange(groups, device=w.device) * v, max=v)
    keep_cols = _keep_chunks(grouped.sum(1), density, rows_in, shfl_chunk(cols))  # (groups, cols)
    mask = torch.empty(rows, cols, dtype=torch.bool, device=w.device)
    mask[perm] = keep_cols.repeat_interleave(v, 0)[:rows]
    perm32 = perm.to(torch.int32)
    return mask, lambda x: ShuffledBlock.from_dense(x, v, perm32)


def _keep_chunks(mass: torch.Tensor, density: float, rows_in: torch.Tensor, chunk: int) -> torch.Tensor:
    """Each group's kept columns, a multiple of `chunk` of them (all of them at most): the groups'
    columns ranked by mass, cut into chunks, and the chunks with the most mass per entry kept
    under one budget. A kernel step multiplies `chunk` (or twice as many) columns at a time, so
    a group whose count is not a multiple pads its last step with zeros (up to ~25% more work at
    K = 1024, 90%); here the budget goes to the heaviest chunks instead."""
    groups, cols = mass.shape
    ranked, order = torch.sort(mass, 1, descending=True)
    n_chunks = ceil_div(cols, chunk)
    sums = F.pad(ranked, (0, n_chunks * chunk - cols)).reshape(groups, n_chunks, chunk).sum(2)
    widths = torch.clamp(cols - torch.arange(n_chunks, device=mass.device) * chunk, max=chunk)
    # a group's chunks are ranked by falling mass, so those kept are a prefix: its count
    counts = _keep_top(sums, density, rows_in[:, None] * widths[None, :]).sum(1) * chunk
    keep = torch.arange(cols, device=mass.device)[None, :] < counts[:, None]  # in ranked order
    return torch.zeros_like(keep).scatter_(1, order, keep)


def shuffle_rows(w: torch.Tensor, v: int, density: float, iters: int = 8) -> torch.Tensor:
    """A row permutation that puts rows with similar importance profiles in the same group of
    `v`, so that one set of kept columns serves the whole group (Shfl-BW).

    Alternates, k-means style, between choosing each group's kept columns (top squared mass,
    one global budget) and re-assigning rows to the group whose kept columns hold most of the
    row's mass, under the capacity of v rows per group. Starts from the identity and from an
    ordering along the principal direction of the row profiles; keeps the best found, so the
    result never keeps less than unshuffled grouping.
    """
    rows, cols = w.shape
    groups = ceil_div(rows, v)
    if groups <= 1 or cols == 0 or density in (0.0, 1.0):
        return torch.arange(rows, device=w.device)
    sq = (w.detach().float() ** 2).cpu().numpy()
    capacity = np.full(groups, v)
    capacity[-1] = rows - (groups - 1) * v
    budget = int(round(density * groups * cols))

    def kept_mass(assign):
        # rows summed per group: a (groups x rows) one-hot product runs on BLAS, unlike np.add.at
        onehot = np.zeros((groups, rows), dtype=np.float32)
        onehot[assign, np.arange(rows)] = 1.0
        mass = onehot @ sq
        flat = mass.ravel()
        top = np.argpartition(flat, flat.size - budget)[flat.size - budget :] if budget else np.empty(0, int)
        keep = np.zeros(flat.size, dtype=np.float32)
        keep[top] = 1.0
        return flat[top].sum(), keep.reshape(groups, cols)

    def reassign(keep):
        score = sq @ keep.T  # (rows, groups): mass each row would keep in each group
        order = np.argsort(-score.max(1), kind="stable")
        left = capacity.copy()
        assign = np.empty(rows, dtype=np.int64)
        for r in order:
            g = int(np.argmax(np.where(left > 0, score[r], -np.inf)))
            assign[r] = g
            left[g] -= 1
        return assign

    identity = np.arange(rows) // v
    profile = sq / np.maximum(sq.sum(1, keepdims=True), 1e-30)
    centred = profile - profile.mean(0)
    direction = np.random.default_rng(0).standard_normal(cols)
    for _ in range(12):  # power iteration: the leading right singular vector, cheaply
        direction = centred.T @ (centred @ direction)
        direction /= max(np.linalg.norm(direction), 1e-30)
    spectral = np.empty(rows, dtype=np.int64)
    spectral[np.argsort(centred @ direction, kind="stable")] = identity

    best_mass, best = -1.0, identity
    for assign in (identity, spectral):
        mass, keep = kept_mass(assign)
        for _ in range(iters):
            if mass > best_mass:
                best_mass, best = mass, assign
            assign = reassign(keep)
            new_mass, keep = kept_mass(assign)
            if new_mass <= mass * (1 + 1e-9):
                break
            mass = new_mass
        if mass > best_mass:
            best_mass, best = mass, assign
    # rows of group g take slots g*v .. g*v + capacity - 1
    return torch.from_numpy(np.argsort(best, kind="stable")).to(w.device)


_PRUNERS = {"csr": _prune_csr, "block": _prune_block, "shfl": _prune_shfl, "nm": _prune_nm, "vnm": _prune_vnm}

__all__ = ["sparsify_weight", "shuffle_rows", "PruneReport"]
