"""Sparse weight formats. Each is immutable and validated at construction."""
from ._base import FormatStats, SparseFormat
from .blocked import BlockSparse
from .csr import CSR
from .nm import NM, VNM
from .shuffled import ShuffledBlock

__all__ = ["CSR", "BlockSparse", "ShuffledBlock", "NM", "VNM", "SparseFormat", "FormatStats"]
