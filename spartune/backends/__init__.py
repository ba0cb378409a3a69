"""What is not ours but competes: cuBLAS dense, cuSPARSE (through torch.sparse), cuSPARSELt 2:4,
and PyTorch's Triton BSR kernel (a benchmark baseline only).

Each backend converts the weight once (cached per format object, dropped with it) and
returns `x @ A^T` (in the caller's `out`, or a tensor of its own when writing into `out`
would cost a copy). They are candidates of the tuner like our kernels, so spartune is never
slower than what a user would otherwise call; the benchmark's baselines use the same
conversions (bench/baselines.py).
"""
from __future__ import annotations

import torch

from ..formats import NM, BlockSparse, SparseFormat
from ._common import GraphReplay, direct_launches, replays_allowed
from .cusparse import cusparse_linear
from .cusparselt import cusparselt_linear, cusparselt_search_linear
from .dense import dense_linear, dense_sddmm, dense_softmax, dense_weight, transient_dense_linear, value_order

__all__ = ["GraphReplay", "direct_launches", "replays_allowed", "library_backends", "release_unused", "dense_weight", "dense_linear", "transient_dense_linear", "cusparse_linear", "cusparselt_linear",
           "cusparselt_search_linear", "REPLAY_OWN_GRAPHS",
           "dense_sddmm", "dense_softmax", "value_order"]


# Backends whose call copies x into a graph of their own and replays it: the tuner times them as
# called (inside its capture they would run the bare product, ~10 us less than their real call
# at decode, and win where they lose)
REPLAY_OWN_GRAPHS = frozenset({"cusparselt", "cusparselt_search"})


# The copies of the weight (`_common.cached` names) each library backend reads: the tuner times
# every backend on each new shape, and the copies the chosen ones do not read are dropped
# (`release_unused`). cuSPARSELt's search answers (a few ints per token count) always stay.
MEMOS = {"dense": ("dense",), "cusparse": ("cusparse",), "cusparselt": ("cslt_compressed", "cslt_graphs"),
         "cusparselt_search": ("cslt_compressed", "cslt_graphs")}


def release_unused(A: SparseFormat, chosen) -> None:
    """Drop the library copies of A (a dense copy, torch's CSR, cuSPARSELt's compressed copy and
    graphs) that no backend named in `chosen` reads: made to time the baselines, kept they would
    make a sparse weight hold several times its dense size."""
    keep = {what for name in chosen for what in MEMOS.get(name, ())}
    for what in {what for whats in MEMOS.values() for what in whats} - keep:
        A.__dict__.pop(f"_backend_{what}", None)


def library_backends(A: SparseFormat) -> dict:
    """The library backends that can run `A`, by name."""
    found = {"dense": dense_linear}
    if A.device.type == "cuda":
        if A.dtype != torch.bfloat16 or not isinstance(A, BlockSparse):
            found["cusparse"] = cusparse_linear
        if isinstance(A, NM) and (A.n, A.m) == (2, 4) and A.dtype in (torch.float16, torch.bfloat16):
            found["cusparselt"] = cusparselt_linear  # algorithm 0
            found["cusparselt_search"] = cusparselt_search_linear  # the search's pick, when not 0
    return found
