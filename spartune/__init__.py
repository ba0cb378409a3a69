"""spartune: fast pruned neural networks on NVIDIA GPUs."""
from .versions import __version__  # noqa: F401

from . import reference  # noqa: E402
from .formats import CSR, NM, VNM, BlockSparse, PackedNM, PackedVNM, FormatStats, ShuffledBlock, SparseFormat  # noqa: E402
from .ops import memory_policy, prepare, set_memory_policy, set_mode  # noqa: E402
from .library import linear, sddmm, sparse_softmax, spmm  # noqa: E402  (differentiable, traceable)
from .nn import SparseConv1d, SparseConv2d, SparseLinear, load_sparse_state_dict, sparsify  # noqa: E402
from .prune import PruneReport, parse_pattern, sparsify_weight  # noqa: E402

__all__ = [
    "CSR", "BlockSparse", "ShuffledBlock", "NM", "VNM", "PackedNM", "PackedVNM", "SparseFormat", "FormatStats",
    "linear", "spmm", "sddmm", "sparse_softmax", "prepare", "set_mode", "set_memory_policy", "memory_policy",
    "sparsify_weight", "parse_pattern", "PruneReport", "reference", "SparseLinear", "SparseConv2d", "SparseConv1d",
    "sparsify", "load_sparse_state_dict",
]
