"""PyTorch front end: SparseLinear, SparseConv2d, SparseConv1d, SparseMultiheadAttention and
sparsify(model), in the spirit of torchao's sparsity API."""
from .attention import SparseMultiheadAttention, disable_fused_fast_paths
from .conv import SparseConv1d, SparseConv2d
from .linear import SparseLinear
from .load import load_sparse_state_dict
from .memory import pack_weights, resident_bytes
from .sparsify import LayerReport, sparsify

__all__ = ["SparseLinear", "SparseConv2d", "SparseConv1d", "SparseMultiheadAttention", "sparsify", "LayerReport",
           "disable_fused_fast_paths", "resident_bytes", "pack_weights", "load_sparse_state_dict"]
