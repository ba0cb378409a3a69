"""What every library backend shares: weight conversions cached per format object (and version
of its values), torch's sparse warnings silenced, and the epilogue as separate torch ops."""
from __future__ import annotations

import contextlib
import warnings

import torch

from ..epilogue import apply_epilogue
from ..formats import SparseFormat, memo


def cached(A: SparseFormat, what: str, make):
    """`make()` once per (format object, what), made again when A's values change in place (a
    converted copy of the weight would be stale); dropped with the format."""
    return memo(A, f"_backend_{what}", make)


@contextlib.contextmanager
def quiet():
    """torch.sparse warns on each conversion ("beta state") and bsr_dense_mm on shapes it has
    no tuned parameters for: noise, not news, in a loop over problems."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def finish(acc, out, bias, activation, residual, scale):
    """The epilogue as separate torch ops: libraries do not fuse it."""
    if bias is None and activation is None and residual is None and scale == 1.0:
        out.copy_(acc)
    else:
        wide = torch.promote_types(acc.dtype, torch.float32)  # fp32 math, float64 kept
        out.copy_(apply_epilogue(acc.to(wide), None if bias is None else bias.to(wide), activation,
                                 None if residual is None else residual.to(wide), scale))
    return out
