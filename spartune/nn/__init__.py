"""PyTorch front end: SparseLinear, SparseMultiheadAttention and sparsify(model), in the spirit
of torchao's sparsity API."""
from .attention import SparseMultiheadAttention, disable_fused_fast_paths
from .linear import SparseLinear
from .sparsify import LayerReport, sparsify

__all__ = ["SparseLinear", "SparseMultiheadAttention", "sparsify", "LayerReport", "disable_fused_fast_paths"]
