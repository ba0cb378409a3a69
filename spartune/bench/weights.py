"""The weights benchmarks run on: a uniform random mask of a pattern over random normal values
(never zeros: a zero would drop out of the pattern), or a real weight pruned by sparsify_weight."""
from __future__ import annotations

from . import suites
from .suites import Spec


def _unit_density(units: int, density: float, cv: float, device, gen):
    """Per-unit keep probability: `density`, spread with coefficient of variation `cv`."""
    import torch

    if cv <= 0:
        return torch.full((units,), density, device=device)
    z = torch.randn(units, generator=gen, device=device)
    return (density * (1.0 + cv * z)).clamp(0.0, 1.0)


def _nonzero_normal(shape, dtype, device, gen):
    """Random normal values with no exact zero (a zero would drop out of the pattern)."""
    import torch

    v = torch.randn(shape, generator=gen, device=device).to(dtype)
    return v.masked_fill_(v == 0, 1.0)


def random_weight(pattern: str, M: int, K: int, density: float, *, dtype, device, gen, row_cv: float = 0.0):
    """(dense weight with zeros, format): a uniform random mask of the pattern (each unit, a
    row / block-row / group of V rows, keeps entries with its own probability when row_cv > 0)
    over random normal values."""
    import torch

    from ..formats import CSR, NM, BlockSparse, ShuffledBlock, ceil_div
    from ..prune import parse_pattern, sparsify_weight
    from ..prune.magnitude import shfl_chunk

    p = parse_pattern(pattern)
    w = _nonzero_normal((M, K), dtype, device, gen)
    if p.kind == "vnm":  # magnitude pruning of i.i.d. values keeps a uniform random V:N:M pattern
        A = sparsify_weight(w, p)
        return A.to_dense(), A
    if p.kind == "csr":
        mask = torch.rand(M, K, generator=gen, device=device) < _unit_density(M, density, row_cv, device, gen)[:, None]
        make = CSR.from_dense
    elif p.kind == "block":
        br, bc = ceil_div(M, p.bm), ceil_div(K, p.bk)
        keep = torch.rand(br, bc, generator=gen, device=device) < _unit_density(br, density, row_cv, device, gen)[:, None]
        mask = keep.repeat_interleave(p.bm, 0).repeat_interleave(p.bk, 1)[:M, :K]
        make = lambda t: BlockSparse.from_dense(t, (p.bm, p.bk))  # noqa: E731
    elif p.kind == "shfl":
        # each group keeps a random set of columns, as many as sparsify_weight would let it: a
        # multiple of its chunk (rounded at random, so the density holds on average)
        groups, chunk = ceil_div(M, p.bm), shfl_chunk(K)
        chunks = _unit_density(groups, density, row_cv, device, gen) * K / chunk
        extra = torch.rand(groups, generator=gen, device=device) < chunks - chunks.floor()
        counts = ((chunks.floor() + extra) * chunk).clamp(max=K)
        rank = torch.rand(groups, K, generator=gen, device=device).argsort(1).argsort(1)
        keep = rank < counts[:, None]
        perm = torch.randperm(M, generator=gen, device=device)
        mask = torch.empty(M, K, dtype=torch.bool, device=device)
        mask[perm] = keep.repeat_interleave(p.bm, 0)[:M]  # slot i of the grouping is row perm[i]
        perm32 = perm.to(torch.int32)
        make = lambda t: ShuffledBlock.from_dense(t, p.bm, perm32)  # noqa: E731
    elif p.kind == "nm":
        groups = ceil_div(K, p.m)
        scores = torch.rand(M, groups, p.m, generator=gen, device=device)
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(2, torch.topk(scores, p.n, 2).indices, True)
        mask = keep.reshape(M, groups * p.m)[:, :K]
        make = lambda t: NM.from_dense(t, p.n, p.m)  # noqa: E731
    else:  # pragma: no cover - parse_pattern knows no other kind
        raise ValueError(f"unknown pattern kind {p.kind!r}")
    w = w.masked_fill_(~mask, 0)
    return w, make(w)


_REAL_CACHE: dict = {}


def make_weight(spec: Spec, *, dtype, device, gen):
    """(dense weight, format) for a problem: random, or the real weight (cut to spec's shape
    when the problem was scaled down) pruned by sparsify_weight."""
    if spec.weight is None:
        return random_weight(spec.pattern, spec.M, spec.K, spec.density, dtype=dtype, device=device, gen=gen,
                             row_cv=spec.row_cv)
    from ..prune import sparsify_weight

    if spec.weight not in _REAL_CACHE:
        _REAL_CACHE[spec.weight] = suites.load_real_weight(spec.weight)
    w = _REAL_CACHE[spec.weight][: spec.M, : spec.K].to(device=device, dtype=dtype)
    fixed = suites.fixed_density(spec.pattern)
    A = sparsify_weight(w, spec.pattern, None if fixed is not None else 1.0 - spec.density)
    return A.to_dense(), A


def revalued(A, gen):
    """The same pattern with new random values (stored zeros, e.g. block padding, kept)."""
    import torch

    v = A.values
    return A.with_values(torch.where(v != 0, _nonzero_normal(v.shape, v.dtype, v.device, gen), torch.zeros((), dtype=v.dtype, device=v.device)))
