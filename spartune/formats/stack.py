"""Formats stacked by rows: the weights of linears that read the same x (q/k/v, gate/up) as one
matrix, so they run as one SpMM (one launch, one pass over x) instead of several small ones."""
from __future__ import annotations

import json
from typing import Sequence

import torch

from ._base import SparseFormat
from .blocked import BlockSparse
from .csr import CSR


def stackable(specs: Sequence[str]) -> bool:
    """Whether formats with these specs stack by rows: the same format (CSR, or BlockSparse of
    one block size), the same columns, and every part but the last a whole number of block rows."""
    fields = [json.loads(s) for s in specs]
    kinds = {(f["format"], tuple(f.get("block") or ()), f["shape"][1]) for f in fields}
    if len(fields) < 2 or len(kinds) != 1:
        return False
    kind = fields[0]["format"]
    if kind == "CSR":
        return True
    if kind == "BlockSparse":
        return all(f["shape"][0] % f["block"][0] == 0 for f in fields[:-1])
    return False


def stack_rows(parts: Sequence[SparseFormat]) -> SparseFormat:
    """One format whose rows are the parts' rows, in order."""
    if not stackable([p.spec for p in parts]):
        raise ValueError(f"cannot stack these by rows: {[p.spec for p in parts]}")
    if len({p.values.dtype for p in parts}) != 1 or len({p.values.device for p in parts}) != 1:
        raise ValueError("the parts must share a dtype and a device")
    rows = sum(p.shape[0] for p in parts)
    cols = parts[0].shape[1]
    starts = torch.tensor([0] + [p.values.shape[0] for p in parts]).cumsum(0).tolist()
    if starts[-1] >= 2**31:
        raise ValueError(f"too many stored entries for int32 pointers: {starts[-1]}")
    crow = torch.cat([parts[0].crow[:1]] + [p.crow[1:] + s for p, s in zip(parts, starts[:-1])])
    col = torch.cat([p.col for p in parts])
    values = torch.cat([p.values for p in parts])
    if isinstance(parts[0], CSR):
        counts = crow[1:] - crow[:-1]
        order = torch.argsort(counts, descending=True, stable=True).to(torch.int32)
        return CSR(shape=(rows, cols), crow=crow, col=col, values=values, row_order=order)
    return BlockSparse(shape=(rows, cols), block=parts[0].block, crow=crow, col=col, values=values)


def stacked(parts: Sequence[SparseFormat], biases: Sequence[torch.Tensor] = (), *, share: bool = True,
            build=lambda make: make()):
    """(the parts stacked by rows, their biases concatenated or None), kept on the first part.

    With `share`, the stacked format owns the only copy of the weight: the parts' values and column indices
    move into its buffers (`Tensor.set_`: the same tensor objects and values, their storage
    shared), so a merged model holds no second copy, and a CUDA graph that replays the stacked
    call reads what the parts hold, in place updates included. The row pointers and biases are
    small copies. Everything is made again when a part or bias changes (another tensor, or an
    in place update: load_state_dict, an optimizer step), so caches derived from the stacked
    format never outlive the values they came from. `build(make)` runs the making (the
    caller's choice of thread and memory pool)."""
    key = _key(parts, biases)
    entry = parts[0].__dict__.get("_stacked_rows")
    if entry is None or entry[0] != key:
        def make():
            with torch.no_grad():
                A, bias = stack_rows(parts), torch.cat(list(biases)) if biases else None
                if share:
                    _share(parts, A)
            return _key(parts, biases), (A, bias)

        entry = build(make)
        object.__setattr__(parts[0], "_stacked_rows", entry)
    return entry[1]


def _key(parts, biases) -> tuple:
    tensors = [t for p in parts for t in (p.values, p.col, p.crow)] + list(biases)
    return tuple((id(t), t.data_ptr(), t._version) for t in tensors)


_ALIGN = 16  # bytes: a part's slice starts where wide loads and TMA can read it


def _share(parts, A) -> bool:
    """Point each part's values and column indices at its slice of A's (when every slice starts
    aligned and the parts are contiguous; otherwise A keeps its own copy)."""
    at, places = [0, 0], []
    for p in parts:
        places.append(tuple(at))
        at = [at[0] + p.values.numel(), at[1] + p.col.numel()]
    if not all(p.values.is_contiguous() and p.col.is_contiguous() for p in parts) or any(
            v * A.values.element_size() % _ALIGN or c * A.col.element_size() % _ALIGN for v, c in places):
        return False
    for p, (v, c) in zip(parts, places):
        p.values.set_(A.values.untyped_storage(), v, p.values.shape, p.values.stride())
        p.col.set_(A.col.untyped_storage(), c, p.col.shape, p.col.stride())
    return True


__all__ = ["stackable", "stack_rows", "stacked"]
