"""Formats stacked by rows: the weights of linears that read the same x (q/k/v, gate/up) as one
matrix, so they run as one SpMM (one launch, one pass over x) instead of several small ones."""
from __future__ import annotations

import json
import weakref
from typing import Sequence

import torch

from ._base import SparseFormat, values_version
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


_stacks: "weakref.WeakKeyDictionary[SparseFormat, dict]" = weakref.WeakKeyDictionary()


def stacked(parts: Sequence[SparseFormat], biases: Sequence[torch.Tensor] = (), *, build=lambda make: make()):
    """(the parts stacked by rows, their biases concatenated or None): a copy, kept per group
    (a layer may sit in several) while its first part lives, outside the format (a deepcopy or
    pickle of the model does not carry it), and made again when a part or bias changes (another
    tensor, or an in place update: load_state_dict, an optimizer step).

    A copy, not the parts moved into one buffer: moving a module's parameters (`Tensor.set_`)
    cut them off from views taken earlier, broke autograd's version checks across a training
    step, and made layers in two groups move back and forth (benchmarks/LOG.md). The cost is
    the merged layers' sparse weight twice in memory, and under a CUDA-graph replay (no Python
    runs) an in-place update made after the capture is not seen: capture again after changing
    weights. `build(make)` runs the making (the caller's choice of thread and memory pool)."""
    key = tuple((id(t), *values_version(t)) for p in parts for t in (p.values, p.col, p.crow)) + tuple(
        (id(b), *values_version(b)) for b in biases)
    group = _stacks.setdefault(parts[0], {})
    entry = group.get(tuple(map(id, parts)))
    if entry is None or entry[0] != key:
        def make():
            with torch.no_grad():  # (the parts' storages held: no later tensor takes their addresses)
                anchors = [t.untyped_storage() for p in parts for t in (p.values, p.col, p.crow)] + [
                    b.untyped_storage() for b in biases]
                return key, (stack_rows(parts), torch.cat(list(biases)) if biases else None), anchors

        entry = group[tuple(map(id, parts))] = build(make)
    return entry[1]


def stacks_of(part: SparseFormat) -> list:
    """The stacked copies (and their biases) kept for groups whose first part is `part`."""
    return [entry[1] for entry in _stacks.get(part, {}).values()]


__all__ = ["stackable", "stack_rows", "stacked", "stacks_of"]
