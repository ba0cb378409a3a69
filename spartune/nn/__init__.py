"""PyTorch front end: SparseLinear and sparsify(model), in the spirit of torchao's sparsity API."""
from .linear import SparseLinear, sparsify

__all__ = ["SparseLinear", "sparsify"]
