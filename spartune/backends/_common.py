"""What every library backend shares: weight conversions cached per format object, torch's
sparse warnings silenced, and the epilogue as separate torch ops."""
from __future__ import annotations

import contextlib
import warnings
import weakref

from ..epilogue import apply_epilogue
from ..formats import SparseFormat

_converted: "weakref.WeakKeyDictionary[SparseFormat, dict]" = weakref.WeakKeyDictionary()


def cached(A: SparseFormat, what: str, make):
    """`make()` once per (format object, what); dropped with the format."""
    per = _converted.setdefault(A, {})
    if what not in per:
        per[what] = make()
    return per[what]


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
        out.copy_(apply_epilogue(acc.float(), None if bias is None else bias.float(), activation,
                                 None if residual is None else residual.float(), scale))
    return out
