"""resident_bytes: what a model's weights hold, the kernels' copies included (CPU)."""
import torch

import spartune as st
from spartune import backends
from spartune.kernels import spmm_nm
from spartune.nn import resident_bytes


def storage_bytes(*tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_a_dense_model_holds_its_state():
    lin = torch.nn.Linear(64, 32)
    tied = torch.nn.ModuleDict({"a": lin, "b": lin})
    assert resident_bytes(tied) == storage_bytes(lin.weight, lin.bias)


def test_a_sparse_layer_counts_its_copies_until_they_are_released():
    torch.manual_seed(0)
    layer = st.nn.SparseLinear(st.sparsify_weight(torch.randn(96, 128, dtype=torch.float16), "2:4"),
                               torch.randn(96, dtype=torch.float16))
    A = layer.weight
    state = resident_bytes(layer)
    assert state == storage_bytes(*A.tensor_list(), layer.bias)
    values, meta, _, _ = spmm_nm.packed(A)  # a kernel's layout
    dense = backends.dense_weight(A)  # a baseline's copy
    csr = backends._common.cached(A, "cusparse", lambda: backends.cusparse.torch_sparse(A))
    sparse_bytes = storage_bytes(csr.values(), csr.crow_indices(), csr.col_indices())
    assert resident_bytes(layer) == state + storage_bytes(values, meta, dense) + sparse_bytes
    spmm_nm.release_unused(A, [])
    backends.release_unused(A, ["dense"])
    assert resident_bytes(layer) == state + storage_bytes(dense)
