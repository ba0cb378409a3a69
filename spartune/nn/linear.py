"""SparseLinear: an nn.Linear whose weight is a spartune format; sparsify(): swap them in."""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from .. import ops
from ..formats import SparseFormat
from ..prune import PruneReport, sparsify_weight


class SparseLinear(nn.Module):
    """y = x @ W^T + b with W held in a sparse format; every call goes through the tuned
    dispatch, so it runs the fastest kernel for its shape (dense cuBLAS included).

    `.to()`, `.half()`, `.cuda()` move and cast the format like any parameter (index tensors
    keep their integer types). Inference only: the sparse weight takes no gradient.
    """

    def __init__(self, weight: SparseFormat, bias: torch.Tensor | None = None):
        super().__init__()
        if not isinstance(weight, SparseFormat):
            raise TypeError(f"weight must be a spartune format, got {type(weight).__name__}")
        self.weight = weight
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, pattern, sparsity: float | None = None, *, return_report=False):
        """Prune `linear`'s weight by magnitude into `pattern` (see sparsify_weight)."""
        fmt, report = sparsify_weight(linear.weight.detach(), pattern, sparsity, return_report=True)
        layer = cls(fmt, None if linear.bias is None else linear.bias.detach())
        return (layer, report) if return_report else layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return ops.linear(x, self.weight, bias)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        tensors = self.weight._tensors()
        moved = {name: fn(t) for name, t in tensors.items()}
        if any(moved[name] is not t for name, t in tensors.items()):
            # a new weight object (re-validated); an unchanged one keeps its tuned choices and caches
            self.weight = dataclasses.replace(self.weight, **moved)
        return self

    def extra_repr(self) -> str:
        return f"{self.weight!r}, bias={self.bias is not None}"


def sparsify(model: nn.Module, pattern, sparsity: float | None = None, *,
             filter_fn: Callable[[str, nn.Linear], bool] | None = None) -> dict[str, PruneReport]:
    """Replace, in place, every nn.Linear of `model` (that `filter_fn(name, module)` accepts)
    by a SparseLinear pruned into `pattern`. Returns each layer's PruneReport by name."""
    reports = {}
    targets = [(name, m) for name, m in model.named_modules()
               if type(m) is nn.Linear and (filter_fn is None or filter_fn(name, m))]
    for name, linear in targets:
        layer, reports[name] = SparseLinear.from_linear(linear, pattern, sparsity, return_report=True)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.to(linear.weight.device))
    return reports
