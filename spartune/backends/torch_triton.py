"""PyTorch's own Triton kernel for BSR @ dense (torch.sparse._triton_ops): a benchmark baseline,
not a tuner candidate (private API, block sizes it has tuned parameters for only)."""
from __future__ import annotations

from . import _common


def bsr_dense_mm(ws):
    """X -> ws @ X for a torch BSR tensor `ws` (cusparse.to_bsr). The kernel is imported here, so
    a torch without it fails when the baseline is built, not while it is timed."""
    from torch.sparse._triton_ops import bsr_dense_mm as mm

    def run(X):
        with _common.quiet():
            return mm(ws, X)

    return run
