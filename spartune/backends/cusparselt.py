"""cuSPARSELt 2:4 on the sparse tensor cores, through torch's semi-structured tensors."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _common
from .dense import dense_weight


def to_semi_structured(w: torch.Tensor):
    """A dense 2:4 weight (fp16/bf16, CUDA) compressed for cuSPARSELt."""
    from torch.sparse import to_sparse_semi_structured

    return to_sparse_semi_structured(w)


def cusparselt_linear(A, x, out, *, bias=None, activation=None, residual=None, scale=1.0):
    """cuSPARSELt 2:4 (torch's semi-structured tensors), for 2:4 weights only."""
    ws = _common.cached(A, "cusparselt", lambda: to_semi_structured(dense_weight(A)))
    return _common.finish(F.linear(x, ws), out, bias, activation, residual, scale)
