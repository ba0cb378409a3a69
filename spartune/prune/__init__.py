"""Magnitude pruning into every pattern spartune runs fast."""
from .magnitude import PruneReport, shuffle_rows, sparsify_weight
from .patterns import Pattern, parse_pattern

__all__ = ["sparsify_weight", "shuffle_rows", "PruneReport", "Pattern", "parse_pattern"]
