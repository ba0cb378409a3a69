"""SparseConv2d and SparseConv1d on the CPU: against torch's convolution in float64, memory
formats, the fused activation, batch norm folded first, autograd, state_dict, and sparsify()
converting only the pointwise convolutions (and transformers' Conv1D, a transposed linear)."""
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.utils.fusion import fuse_conv_bn_eval

import spartune as st
from spartune.nn.conv import is_pointwise

PATTERNS = [("csr", 0.7), ("block:16", 0.5), ("shfl:16", 0.5), ("2:4", None), ("16:2:8", None)]


def reference(layer, x):
    w = layer.weight.to_dense().double()
    y = F.conv2d(x.double(), w[:, :, None, None], None if layer.bias is None else layer.bias.double())
    return {None: lambda v: v, "relu": F.relu, "silu": F.silu}[layer.activation](y)


@pytest.mark.parametrize("pattern, sparsity", PATTERNS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_conv2d(pattern, sparsity, channels_last):
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 48, 1).double()
    layer = st.SparseConv2d.from_conv(conv, pattern, sparsity, activation="relu")
    x = torch.randn(3, 32, 5, 7, dtype=torch.float64)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = layer(x)
    assert y.shape == (3, 48, 5, 7) and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(y, reference(layer, x), atol=1e-12)
    dense = layer.weight.to_dense()
    assert torch.equal(dense, torch.where(dense != 0, conv.weight[:, :, 0, 0], 0))  # kept entries are the conv's


def test_an_unbatched_image_as_conv2d_takes_it():
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 24, 1).double()
    layer = st.SparseConv2d.from_conv(conv, "csr", 0.5)
    x = torch.randn(16, 5, 6, dtype=torch.float64)
    y = layer(x)
    assert y.shape == (24, 5, 6)
    assert torch.allclose(y, reference(layer, x[None])[0], atol=1e-12)


def test_batch_norm_folded_first_matches_conv_bn_relu():
    torch.manual_seed(1)
    conv, bn = nn.Conv2d(16, 24, 1, bias=False).double(), nn.BatchNorm2d(24).double()
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    conv.eval(), bn.eval()
    folded = fuse_conv_bn_eval(conv, bn)
    layer = st.SparseConv2d.from_conv(folded, "csr", 0.0, activation="relu")  # nothing pruned: exactly conv-bn-relu
    x = torch.randn(2, 16, 4, 4, dtype=torch.float64)
    assert torch.allclose(layer(x), F.relu(bn(conv(x))), atol=1e-12)


def test_gradients_reach_the_values_and_the_input():
    torch.manual_seed(2)
    layer = st.SparseConv2d.from_conv(nn.Conv2d(16, 32, 1).double(), "block:16", 0.5, activation="silu")
    layer.requires_grad_(True)
    x = torch.randn(2, 16, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,), fast_mode=True)  # w.r.t. the input

    def f(x, values, bias):  # w.r.t. the parameters, swapped in
        return functional_call(layer, {"linear.weight_values": values, "linear.bias": bias}, (x,))

    values, bias = (p.detach().clone().requires_grad_() for p in (layer.linear.weight_values, layer.bias))
    assert torch.autograd.gradcheck(f, (x, values, bias), fast_mode=True)


def test_state_dict_round_trip():
    layer = st.SparseConv2d.from_conv(nn.Conv2d(8, 12, 1), "csr", 0.6, activation="relu")
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    other = st.SparseConv2d.from_conv(nn.Conv2d(8, 12, 1), "csr", 0.6, activation="relu")
    other.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert torch.equal(other.weight.to_dense(), layer.weight.to_dense()) and torch.equal(other.bias, layer.bias)


def test_refuses_what_it_cannot_run():
    for conv in (nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 1, stride=2), nn.Conv2d(8, 8, 1, groups=8), nn.Conv2d(8, 8, 1, padding=1)):
        assert not is_pointwise(conv)
        with pytest.raises(ValueError, match="pointwise"):
            st.SparseConv2d.from_conv(conv, "csr", 0.5)
    layer = st.SparseConv2d.from_conv(nn.Conv2d(8, 12, 1), "csr", 0.5)
    with pytest.raises(ValueError, match="expects"):
        layer(torch.randn(2, 7, 3, 3))
    with pytest.raises(ValueError, match="activation"):
        st.SparseConv2d(layer.weight, activation="tanh")


def test_sparsify_converts_pointwise_convolutions_only():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Conv2d(16, 32, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    reports = st.sparsify(model, "csr", 0.5)
    assert isinstance(model[3], st.SparseConv2d) and isinstance(model[7], st.SparseLinear)
    assert isinstance(model[0], nn.Conv2d) and isinstance(model[2], nn.Conv2d)
    assert "pointwise" in reports["0"].skipped and "pointwise" in reports["2"].skipped
    assert reports["3"].pattern == "csr" and reports["3"].shape == (32, 16)
    y = model(x)  # the converted model runs and matches its dense equivalent
    dense = nn.Sequential(*[m for m in model]).double()
    dense[3] = nn.Conv2d(16, 32, 1).double()
    dense[3].weight.data = model[3].weight.to_dense()[:, :, None, None]
    dense[3].bias.data = model[3].bias.data
    dense[7] = nn.Linear(32, 10).double()
    dense[7].weight.data, dense[7].bias.data = model[7].weight.to_dense(), model[7].bias.data
    assert torch.allclose(y, dense(x), atol=1e-12)


def test_compiles_without_graph_breaks():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU(), nn.Conv2d(32, 16, 1))
    st.sparsify(model, "csr", 0.5)
    x = torch.randn(2, 16, 5, 5)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), model(x), atol=1e-5)
    model.requires_grad_(True)
    compiled(x).sum().backward()  # training through the compiled graph
    assert model[0].linear.weight_values.grad is not None


# --- 1-D pointwise convolutions, and transformers' Conv1D (a transposed linear) ---------------
@pytest.mark.parametrize("pattern,sparsity", [("csr", 0.7), ("block:16", 0.5), ("2:4", None)])
def test_conv1d_matches_torch_in_float64(pattern, sparsity):
    torch.manual_seed(5)
    conv = nn.Conv1d(32, 48, 1).double()
    layer = st.SparseConv1d.from_conv(conv, pattern, sparsity, activation="relu")
    w = layer.weight.to_dense()[:, :, None]
    for x in (torch.randn(3, 32, 7, dtype=torch.float64), torch.randn(3, 7, 32, dtype=torch.float64).transpose(1, 2)):
        expect = F.relu(F.conv1d(x, w, layer.bias))
        y = layer(x)
        assert y.shape == (3, 48, 7) and torch.allclose(y, expect, atol=1e-12)
    assert torch.allclose(layer(x[0]), expect[0], atol=1e-12)  # unbatched


def test_conv1d_refuses_what_it_cannot_run():
    for conv in (nn.Conv1d(8, 8, 3), nn.Conv1d(8, 8, 1, stride=2), nn.Conv1d(8, 8, 1, groups=8),
                 nn.Conv1d(8, 8, 1, padding=1), nn.Conv2d(8, 8, 1)):
        with pytest.raises(ValueError, match="pointwise Conv1d .*: (its|it|not)"):
            st.SparseConv1d.from_conv(conv, "csr", 0.5)
    with pytest.raises(ValueError, match="pointwise Conv2d"):
        st.SparseConv2d.from_conv(nn.Conv1d(8, 8, 1), "csr", 0.5)
    layer = st.SparseConv1d.from_conv(nn.Conv1d(8, 12, 1), "csr", 0.5)
    with pytest.raises(ValueError, match="length"):
        layer(torch.randn(2, 8, 3, 3))


def test_sparsify_converts_pointwise_conv1d_and_reports_the_rest():
    torch.manual_seed(6)
    model = nn.Sequential(nn.Conv1d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv1d(16, 24, 1)).double()
    x = torch.randn(2, 8, 9, dtype=torch.float64)
    reports = st.sparsify(model, "csr", 0.5)
    assert isinstance(model[2], st.SparseConv1d) and isinstance(model[0], nn.Conv1d)
    assert "pointwise" in reports["0"].skipped and reports["2"].shape == (24, 16) and reports["2"].pattern == "csr"
    h = F.relu(model[0](x))
    assert torch.allclose(model(x), F.conv1d(h, model[2].weight.to_dense()[:, :, None], model[2].bias), atol=1e-12)


def test_sparsify_converts_transformers_conv1d():
    """GPT-2's layers are transformers' Conv1D, x @ W + b with W (in, out): each becomes a
    SparseLinear holding W^T pruned, and the model computes what the original does with the pruned
    weight; a subclass that overrides forward is reported, not converted."""
    import copy

    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    torch.manual_seed(7)

    class Scaled(pytorch_utils.Conv1D):
        def forward(self, x):
            return 2 * super().forward(x)

    class Block(nn.Module):  # GPT-2's MLP
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = pytorch_utils.Conv1D(64, 16), pytorch_utils.Conv1D(16, 64)
            self.odd = Scaled(16, 16)

        def forward(self, x):
            return self.odd(self.c_proj(F.gelu(self.c_fc(x))))

    model = Block().double()
    with torch.no_grad():
        model.c_fc.bias.normal_(), model.c_proj.bias.normal_()
    original = copy.deepcopy(model)
    reports = st.sparsify(model, "csr", 0.75)
    assert isinstance(model.c_fc, st.SparseLinear) and isinstance(model.c_proj, st.SparseLinear)
    assert model.odd is not None and type(model.odd) is Scaled and "overrides" in reports["odd"].skipped
    assert reports["c_fc"].shape == (64, 16) and reports["c_proj"].shape == (16, 64)
    with torch.no_grad():
        for name in ("c_fc", "c_proj"):
            dense = getattr(model, name).weight.to_dense()  # (out, in): the original's W^T, pruned
            w = getattr(original, name).weight
            assert torch.equal(dense[dense != 0], w.T[dense != 0]) and (dense == 0).float().mean() == 0.75
            w.copy_(dense.T)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    assert torch.allclose(model(x), original(x), atol=1e-12)


def test_pointwise_edge_cases_in_sparsify():
    """Lazy convolutions are reported (not a raw error), kernel-size-1 convolutions that pad
    nothing (padding="same", any padding mode at padding 0) are converted, padded ones named."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.LazyConv1d(8, 1), nn.Conv1d(4, 8, 1, padding="same"),
                          nn.Conv2d(4, 8, 1, padding_mode="reflect"), nn.Conv1d(4, 8, 1, padding=1))
    reports = st.sparsify(model, "csr", 0.5)
    assert "lazy" in reports["0"].skipped and isinstance(model[0], nn.LazyConv1d)
    assert isinstance(model[1], st.SparseConv1d) and isinstance(model[2], st.SparseConv2d)
    assert "pads by (1,)" in reports["3"].skipped and isinstance(model[3], nn.Conv1d)


def test_conv1d_output_is_contiguous_as_torchs():
    layer = st.SparseConv1d.from_conv(nn.Conv1d(8, 12, 1), "csr", 0.5)
    y = layer(torch.randn(2, 8, 5))
    assert y.is_contiguous() and y.view(2, -1).shape == (2, 60)
