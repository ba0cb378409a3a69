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


def stacked(parts: Sequence[SparseFormat], biases: Sequence[torch.Tensor] = ()):
    """(stack_rows(parts), the biases concatenated or None), kept on the first part and made
    again when any part or bias changes (another object, or values updated in place:
    load_state_dict, an optimizer step)."""
    key = tuple((id(t), t.data_ptr(), t._version) for t in [*(p.values for p in parts), *biases])
    entry = parts[0].__dict__.get("_stacked_rows")
    if entry is None or entry[0] != key:
        with torch.no_grad():
            entry = (key, (stack_rows(parts), torch.cat(list(biases)) if biases else None))
        object.__setattr__(parts[0], "_stacked_rows", entry)
    return entry[1]


__all__ = ["stackable", "stack_rows", "stacked"]
