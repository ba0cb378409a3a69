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


def test_a_library_copy_made_again_keeps_no_dense_copy():
    # cuSPARSE's CSR is made from a dense copy that is not kept (after an optimizer step the next
    # call makes it again: a dense copy kept then would stay until another shape is tuned)
    A = st.sparsify_weight(torch.randn(64, 96), "csr", 0.9)
    x, out = torch.randn(5, 96), torch.empty(5, 64)
    backends.cusparse_linear(A, x, out)
    A.values.mul_(2.0)
    y = backends.cusparse_linear(A, x, out)
    assert "_backend_cusparse" in A.__dict__ and "_backend_dense" not in A.__dict__
    torch.testing.assert_close(y, x @ A.to_dense().T)


def test_fused_stacks_count():
    from spartune.formats import stack

    torch.manual_seed(1)
    q, k = (st.nn.SparseLinear(st.sparsify_weight(torch.randn(32, 64), "csr", 0.8)) for _ in range(2))
    model = torch.nn.ModuleDict({"q": q, "k": k})
    alone = resident_bytes(model)
    fused, _ = stack.stacked([q.weight, k.weight])
    assert resident_bytes(model) == alone + storage_bytes(*fused.tensor_list())


def test_refuses_what_is_not_a_module():
    import pytest

    with pytest.raises(TypeError, match="takes an nn.Module"):
        resident_bytes(st.sparsify_weight(torch.randn(8, 8), "csr", 0.5))


def test_a_layout_an_sddmm_on_the_same_pattern_reads_is_kept():
    """A linear call's release keeps CSR's bitmap while an sddmm on the same pattern runs its
    dense path (which reads it), and drops it, and the banded ELL, otherwise."""
    from spartune import dispatch
    from spartune.kernels import _bitmap, _ell, sddmm
    from spartune.tune.tuner import Choice

    for sddmm_choice, kept in ((Choice("sddmm", sddmm.Config("dense", 32, 32, 32), None, None), True),
                               (Choice("sddmm", sddmm.Config("gather", 32, 32, 32), None, None), False),
                               (Choice("dense", None, None, None), False), (None, False)):
        A = st.sparsify_weight(torch.randn(64, 96), "csr", 0.8)
        _bitmap.csr_bitmap(A), _ell.banded_ell(A)
        if sddmm_choice is not None:
            dispatch.state(A, lambda A: None).chosen[("sddmm", "a call")] = sddmm_choice
        st.linear(torch.randn(3, 96), A)
        picks = [c.config for c in dispatch.state(A, None).chosen.values() if c.backend == "csr"]
        assert not any(c.path in ("dense", "expand", "ell") for c in picks)  # (so only the sddmm can keep them)
        assert ("_spartune_csr_bitmap" in A.__dict__) == kept, sddmm_choice
        assert "_spartune_banded_ell" not in A.__dict__
