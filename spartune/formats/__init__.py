"""Sparse weight formats. Each is immutable and validated at construction.

Besides the formats, the helpers other layers share (pruning, kernels, benchmarks): block sizes,
ceil_div, pointers from counts, the unit of every item, and PATTERN_CACHES (memos on a format that depend on its
pattern only, so that a format with new values keeps them); `transposed`, the format of A^T
that backward passes multiply by."""
from ._base import (
    BLOCK_SIZES,
    PATTERN_CACHES,
    FormatStats,
    SparseFormat,
    ceil_div,
    check_block_size,
    check_dense_weight,
    format_class,
    memo,
    pointers_from_counts,
    unit_of_items,
    values_anchor,
    values_version,
)
from .blocked import BlockSparse
from .csr import CSR
from .nm import NM, VNM, PackedNM, PackedVNM
from .shuffled import ShuffledBlock
from .transpose import transposed

__all__ = ["CSR", "BlockSparse", "ShuffledBlock", "NM", "VNM", "PackedNM", "PackedVNM", "SparseFormat", "FormatStats", "BLOCK_SIZES",
           "PATTERN_CACHES", "ceil_div", "check_block_size", "check_dense_weight", "format_class", "memo", "pointers_from_counts",
           "transposed", "unit_of_items", "values_anchor", "values_version"]
