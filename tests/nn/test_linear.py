"""SparseLinear and sparsify(model) against the dense model they came from."""
import pytest
import torch
from torch import nn

import spartune as st
from spartune.nn import SparseLinear, sparsify


def test_sparsify_replaces_linears_and_matches_pruned_dense():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32, bias=False))
    x = torch.randn(5, 64)
    reports = sparsify(model, "block:16", 0.5)
    assert set(reports) == {"0", "2"} and all(0 < r.retained < 1 for r in reports.values())
    assert isinstance(model[0], SparseLinear) and isinstance(model[2], SparseLinear)
    w0, w2 = model[0].weight.to_dense(), model[2].weight.to_dense()
    expect = torch.relu(x @ w0.T + model[0].bias) @ w2.T
    assert torch.allclose(model(x), expect, atol=1e-4)


def test_filter_and_casts_keep_the_format_valid():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 16))
    sparsify(model, "csr", 0.8, filter_fn=lambda name, m: m.out_features == 16)
    assert type(model[0]) is nn.Linear and isinstance(model[1], SparseLinear)
    model.half()
    assert model[1].weight.dtype == torch.float16 and model[1].weight.col.dtype == torch.int16
    assert model[1].bias.dtype == torch.float16


def test_bad_inputs():
    with pytest.raises(TypeError):
        SparseLinear(torch.randn(4, 4))
    fmt = st.CSR.from_dense(torch.eye(4))
    with pytest.raises(ValueError, match="bias must have shape"):
        SparseLinear(fmt, torch.randn(3))


@pytest.mark.parametrize("pattern, sparsity", [("csr", 0.9), ("2:4", None), ("block:32", 0.75)])
def test_values_assigned_through_data_reach_the_next_call(pattern, sparsity):
    """`vector_to_parameters` assigns `p.data = t`: the copies a tuned call reads (a dense copy,
    packed layouts) are made again, as after an in-place optimizer step."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    torch.manual_seed(0)
    layer = SparseLinear.from_linear(nn.Linear(64, 48), pattern, sparsity)
    x = torch.randn(5, 64)
    with torch.no_grad():
        y0 = layer(x)
        vector_to_parameters(2 * parameters_to_vector(layer.parameters()), layer.parameters())
        y1 = layer(x)
        with_data = x.double() @ layer.weight.to_dense().double().T + layer.bias.double()
        torch.testing.assert_close(y1.double(), with_data, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(y1, 2 * y0, rtol=1e-4, atol=1e-4)
        for p in layer.parameters():  # in place under no_grad, as torch.optim does
            p.mul_(0.5)
        torch.testing.assert_close(layer(x), y0, rtol=1e-4, atol=1e-4)
