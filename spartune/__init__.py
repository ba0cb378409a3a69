"""spartune: fast pruned neural networks on NVIDIA GPUs."""
from .formats import CSR, NM, VNM, BlockSparse, FormatStats, ShuffledBlock, SparseFormat

__version__ = "0.1.0"
from .prune import PruneReport, parse_pattern, sparsify_weight
