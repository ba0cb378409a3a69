"""SparseLinear and sparsify(model) against the dense model they came from."""
import gc
import weakref

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


def _autocast_pair(pattern="csr", sparsity=0.75, requires_grad=False):
    torch.manual_seed(3)
    dense = nn.Linear(64, 48)
    layer = SparseLinear.from_linear(dense, pattern, sparsity)
    layer.requires_grad_(requires_grad)
    with torch.no_grad():
        dense.weight.copy_(layer.weight.to_dense())
    return dense, layer


@pytest.mark.parametrize("pattern, sparsity", [("csr", 0.75), ("block:16", 0.5)])
def test_autocast_runs_as_nn_linear_does(pattern, sparsity):
    """Under torch.autocast a float32 layer returns the autocast dtype, as nn.Linear: inference on
    a low-precision copy of the weight, made again after the values change."""
    dense, layer = _autocast_pair(pattern, sparsity)
    x = torch.randn(5, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        y, want = layer(x), dense(x)
        assert y.dtype == want.dtype == torch.float16
        torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
        copy = layer.weight.__dict__["_autocast_torch.float16"][1]
        assert layer(x).dtype == torch.float16 and layer.weight.__dict__["_autocast_torch.float16"][1] is copy
        layer.weight_values.mul_(2)  # an optimizer step: the copy follows
        torch.testing.assert_close(layer(x).float(), 2 * want.float() - dense.bias.float(), rtol=3e-2, atol=3e-2)
    assert layer.weight.dtype == torch.float32 and layer(x).dtype == torch.float32  # outside: as before


def test_autocast_with_autograd_reaches_the_float32_values():
    dense, layer = _autocast_pair(requires_grad=True)
    x = torch.randn(5, 64)
    with torch.autocast("cpu", dtype=torch.float16):
        y = layer(x)
        assert y.dtype == torch.float16
    y.float().square().sum().backward()
    assert layer.weight_values.grad.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):
        want = dense(x)
    want.float().square().sum().backward()
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
    grad = layer.weight.with_values(layer.weight_values.grad).to_dense()
    mask = layer.weight.to_dense() != 0
    torch.testing.assert_close(grad[mask], dense.weight.grad[mask], rtol=3e-2, atol=3e-2)


def test_a_copy_holds_its_values_address_so_a_new_tensor_cannot_take_it():
    """`p.data = t1`, a call, then `p.data = t2; p.data = t3` with no call between: t3 cannot sit
    at t1's address (the copy made from t1 holds its storage), so the copy is made again."""
    from spartune.backends.dense import dense_linear

    torch.manual_seed(0)
    layer = SparseLinear.from_linear(nn.Linear(64, 32, bias=False), "csr", 0.5)
    p, x = layer.weight_values, torch.randn(3, 64)
    with torch.no_grad():
        for call in (lambda: layer(x), lambda: dense_linear(layer.weight, x, torch.empty(3, 32))):
            p.data = torch.randn(p.shape)
            first = p.data_ptr()
            call()
            p.data = torch.randn(p.shape)
            p.data = 100 * torch.randn(p.shape)
            assert p.data_ptr() != first
            torch.testing.assert_close(call(), x @ layer.weight.to_dense().T, rtol=1e-4, atol=1e-3)


def test_autocast_runs_a_subclass_forward_once_and_meta_tensors_pass_by():
    class Doubled(SparseLinear):
        calls = 0

        def forward(self, x, **kw):
            Doubled.calls += 1
            return 2 * super().forward(x, **kw)

    _, layer = _autocast_pair()
    layer.__class__ = Doubled
    x = torch.randn(5, 64)
    with torch.no_grad():
        plain = layer(x)
        with torch.autocast("cpu", dtype=torch.float16):
            assert Doubled.calls == 1 and layer(x).dtype == torch.float16 and Doubled.calls == 2
            torch.testing.assert_close(layer(x).float(), plain, rtol=2e-2, atol=2e-2)
    meta = SparseLinear.from_linear(nn.Linear(64, 48), "csr", 0.5).to("meta")
    assert meta(torch.empty(4, 64, device="meta")).shape == (4, 48)


def test_autocast_keeps_no_copy_under_the_lean_memory_policy(monkeypatch):
    """Lean runs the weight in its own dtype (tuned once, not per call), and the switch to lean
    drops the copies speed made."""
    from spartune import dispatch

    _, layer = _autocast_pair()
    x = torch.randn(5, 64)
    before = st.memory_policy()
    st.set_memory_policy("speed")
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            assert layer(x).dtype == torch.float16 and "_autocast_torch.float16" in layer.weight.__dict__
            st.set_memory_policy("lean")
            assert "_autocast_torch.float16" not in layer.weight.__dict__
            tunes = []
            monkeypatch.setattr(dispatch, "tune_linear", lambda *a, _t=dispatch.tune_linear: tunes.append(1) or _t(*a))
            ys = [layer(x) for _ in range(3)]
    finally:
        st.set_memory_policy(before)
    assert all(y.dtype == torch.float16 for y in ys) and "_autocast_torch.float16" not in layer.weight.__dict__
    assert len(tunes) == 1  # one tuning for the three calls
    torch.testing.assert_close(ys[0].double(), x.double() @ layer.weight.to_dense().double().T
                               + layer.bias.double(), rtol=2e-2, atol=2e-2)


def test_autocast_keeps_the_bias_copy_as_it_keeps_the_weights():
    """The fp16 bias is made once (not one more cast kernel per call) and follows an edit; the
    switch to lean drops it with the weight's copy."""
    dense, layer = _autocast_pair()
    x = torch.randn(5, 64)
    kept_bias = lambda: layer.weight.__dict__["_autocast_bias_torch.float16"][1]  # noqa: E731 (dispatch.cast_bias's memo)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        layer(x)
        kept = kept_bias()
        assert kept.dtype == torch.float16 and torch.equal(kept, layer.bias.half())
        layer(x)
        assert kept_bias() is kept
        layer.bias.add_(1)
        dense.bias.add_(1)
        torch.testing.assert_close(layer(x).float(), dense(x).float(), rtol=2e-2, atol=2e-2)
        assert kept_bias() is not kept
    before = st.memory_policy()
    st.set_memory_policy("speed")
    try:
        st.set_memory_policy("lean")
        assert "_autocast_bias_torch.float16" not in layer.weight.__dict__
    finally:
        st.set_memory_policy(before)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        layer(x)
    copy = weakref.ref(kept_bias())
    del layer, dense, kept_bias
    gc.collect()
    assert copy() is None  # gone with its layer


def test_a_model_sparsified_under_inference_mode_runs():
    """Inference tensors have no version counter: the copies kept for the kernels (here autocast's)
    are keyed by the values' address alone, instead of raising."""
    torch.manual_seed(0)
    x = torch.randn(3, 64)
    with torch.inference_mode():
        model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 16))
        sparsify(model, "csr", 0.5)
        assert model[0].weight_values.is_inference()
        plain = model(x)
        with torch.autocast("cpu", dtype=torch.float16):
            cast = [model(x), model(x)]
    h = x.double()
    for layer in model:
        h = h @ layer.weight.to_dense().double().T + layer.bias.double() if isinstance(layer, SparseLinear) else layer(h)
    torch.testing.assert_close(plain.double(), h, rtol=1e-4, atol=1e-4)
    for y in cast:
        assert y.dtype == torch.float16
        torch.testing.assert_close(y.double(), h, rtol=2e-2, atol=2e-2)
