"""load_sparse_state_dict: a sparsified model's checkpoint into a freshly built dense model, on the
CPU in float64: the same layers come back sparse, ties shared, outputs equal to the saved model's."""
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import spartune as st
from spartune.nn import SparseMultiheadAttention


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)
        self.head = nn.Linear(32, 32, bias=False)
        self.tail = nn.Linear(32, 32, bias=False)
        self.tail.weight = self.head.weight  # tied
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.mix = nn.Conv1d(32, 32, 1)
        self.pixels = nn.Conv2d(32, 16, 1)
        self.spatial = nn.Conv2d(16, 16, 3, padding=1)  # stays dense

    def forward(self, x):
        h = self.down(F.gelu(self.up(x)))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = self.mix(h.transpose(1, 2)).transpose(1, 2)
        h = self.tail(self.head(h))
        img = self.pixels(h.transpose(1, 2)[..., None])
        return h.sum() + self.spatial(img).sum()


def saved(model):
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return torch.load(io.BytesIO(buf.getvalue()))


def sparse_net(seed=0):
    torch.manual_seed(seed)
    model = Net().double().eval()
    st.sparsify(model, {"up": "2:4", "down": ("csr", 0.7), "head": ("block:16", 0.5), "tail": ("block:16", 0.5),
                        "attn.in_proj": ("csr", 0.5), "mix": ("csr", 0.6), "pixels": ("csr", 0.5)})
    return model


def test_a_checkpoint_comes_back_sparse_into_a_fresh_model():
    model = sparse_net()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    expect = model(x)
    fresh = Net().double().eval()  # another draw of every dense weight
    result = st.load_sparse_state_dict(fresh, saved(model))
    assert not result.missing_keys and not result.unexpected_keys
    for name in ("up", "down", "head", "tail"):
        layer, built = getattr(model, name), getattr(fresh, name)
        assert isinstance(built, st.SparseLinear) and built.weight.signature == layer.weight.signature
        assert torch.equal(built.weight.to_dense(), layer.weight.to_dense())
    assert fresh.tail.weight_values is fresh.head.weight_values  # the tie, shared again
    assert isinstance(fresh.attn, SparseMultiheadAttention) and isinstance(fresh.attn.in_proj, st.SparseLinear)
    assert isinstance(fresh.mix, st.SparseConv1d) and isinstance(fresh.pixels, st.SparseConv2d)
    assert isinstance(fresh.spatial, nn.Conv2d)
    assert torch.equal(fresh(x), expect)


def test_the_loaded_model_trains_as_the_dense_one_would():
    model = sparse_net()
    fresh = Net().double()
    st.load_sparse_state_dict(fresh, saved(model))
    assert fresh.down.weight_values.requires_grad and fresh.down.bias.requires_grad
    fresh(torch.randn(2, 5, 32, dtype=torch.float64)).backward()
    assert fresh.down.weight_values.grad is not None


def test_a_sparse_layer_the_model_cannot_hold_is_refused_before_any_change():
    sd = saved(sparse_net())
    sd = {k.replace("down.", "spatial."): v for k, v in sd.items() if not k.startswith("spatial.")}
    fresh = Net().double()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match=r"'spatial'.*kernel size is \(3, 3\)"):
        st.load_sparse_state_dict(fresh, sd)
    assert isinstance(fresh.up, nn.Linear) and all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())


def test_a_sparse_layer_missing_a_tensor():
    """strict: refused before any change, naming the key; strict=False: that layer stays as it is
    and load_state_dict's result lists what did not fit, the rest loads."""
    sd = saved(sparse_net())
    del sd["down.weight_values"]
    fresh = Net().double()
    with pytest.raises(KeyError, match="'down'.*down.weight_values"):
        st.load_sparse_state_dict(fresh, sd)
    assert isinstance(fresh.up, nn.Linear) and isinstance(fresh.attn, nn.MultiheadAttention)
    result = st.load_sparse_state_dict(fresh, sd, strict=False)
    assert isinstance(fresh.down, nn.Linear) and isinstance(fresh.up, st.SparseLinear)
    assert "down.weight" in result.missing_keys and "down.weight_col" in result.unexpected_keys


def test_a_dense_checkpoint_loads_as_load_state_dict_does():
    torch.manual_seed(1)
    source, fresh = Net().double(), Net().double()
    st.load_sparse_state_dict(fresh, saved(source))
    assert all(type(a) is type(b) for a, b in zip(source.modules(), fresh.modules()))
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), fresh.state_dict().values()))


def test_a_sparsified_gpt2_checkpoint_into_a_fresh_gpt2():
    """transformers' GPT-2 (its Conv1D layers, tied embeddings), built locally: sparsified, saved,
    loaded into a freshly initialised GPT-2, the same logits."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=97, n_positions=16)
    torch.manual_seed(9)
    model = transformers.GPT2LMHeadModel(config).double().eval()
    st.sparsify(model, {"*.mlp.*": ("csr", 0.75), "*.attn.c_attn": "2:4"})
    ids = torch.randint(0, 97, (2, 11))
    expect = model(ids).logits
    torch.manual_seed(10)
    fresh = transformers.GPT2LMHeadModel(config).double().eval()
    result = st.load_sparse_state_dict(fresh, saved(model))
    assert not result.missing_keys and not result.unexpected_keys
    assert isinstance(fresh.transformer.h[0].mlp.c_fc, st.SparseLinear)
    assert isinstance(fresh.transformer.h[0].attn.c_attn, st.SparseLinear)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    assert torch.equal(fresh(ids).logits, expect)


def test_a_sparsified_gpt2_saved_by_save_pretrained(tmp_path):
    """save_pretrained writes safetensors without the tied lm_head: loaded strictly all the same."""
    transformers = pytest.importorskip("transformers")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=97, n_positions=16)
    torch.manual_seed(14)
    model = transformers.GPT2LMHeadModel(config).eval()
    st.sparsify(model, {"*.h.0.mlp.*": ("csr", 0.75), "*.h.1.*": ("block:16", 0.5)})
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 97, (2, 9))
    fresh = transformers.GPT2LMHeadModel(config).eval()
    result = st.load_sparse_state_dict(fresh, safetensors_torch.load_file(str(tmp_path / "model.safetensors")))
    assert not result.missing_keys and not result.unexpected_keys
    assert isinstance(fresh.transformer.h[1].attn.c_proj, st.SparseLinear)
    assert torch.equal(fresh(ids).logits, model(ids).logits)


def test_ties_come_back_from_a_checkpoint_that_kept_one_copy(tmp_path):
    """safetensors' save_model keeps one copy of tied tensors: the tied layer shares the first's
    weight and bias again, as in the saved model."""
    safetensors_torch = pytest.importorskip("safetensors.torch")

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
            self.b.weight, self.b.bias = self.a.weight, self.a.bias

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(11)
    model = Tied().double()
    st.sparsify(model, "csr", 0.5)
    path = tmp_path / "tied.safetensors"
    safetensors_torch.save_model(model, str(path))
    fresh = Tied().double()
    result = st.load_sparse_state_dict(fresh, safetensors_torch.load_file(str(path)))
    assert not result.missing_keys and not result.unexpected_keys
    assert fresh.b.weight_values is fresh.a.weight_values and fresh.b.bias is fresh.a.bias
    assert len(list(fresh.parameters())) == 2
    x = torch.randn(3, 16, dtype=torch.float64)
    assert torch.equal(fresh(x), model(x))


def test_the_layers_take_the_models_dtype_and_refuse_another_shape():
    sd = saved(sparse_net())
    fresh = Net().double().half()
    st.load_sparse_state_dict(fresh, sd)
    assert fresh.down.weight_values.dtype == torch.float16 and fresh.up.weight_values.dtype == torch.float16
    wide = Net().double()
    wide.up = nn.Linear(32, 128)
    with pytest.raises(ValueError, match=r"'up' is \(64, 32\) in the checkpoint and \(128, 32\)"):
        st.load_sparse_state_dict(wide, sd)
    assert isinstance(wide.down, nn.Linear)  # nothing changed


def test_a_model_that_is_the_layer_itself_and_layers_it_lacks():
    torch.manual_seed(12)
    holder = nn.Sequential(nn.Linear(8, 8))
    st.sparsify(holder, "csr", 0.5)
    sd = {k.removeprefix("0."): v for k, v in saved(holder).items()}
    with pytest.raises(ValueError, match="the model itself is this layer"):
        st.load_sparse_state_dict(nn.Linear(8, 8), sd)
    backbone = nn.Sequential(nn.Linear(8, 8))  # a checkpoint with a head the model has not
    sd = {**saved(holder), **{f"head.{k.removeprefix('0.')}": v for k, v in saved(holder).items()}}
    with pytest.raises(ValueError, match="'head'"):
        st.load_sparse_state_dict(backbone, sd)
    result = st.load_sparse_state_dict(backbone, sd, strict=False)
    assert isinstance(backbone[0], st.SparseLinear) and "head.weight_values" in result.unexpected_keys


def test_a_module_held_under_two_names():
    torch.manual_seed(13)
    shared = nn.Linear(8, 8)
    model = nn.ModuleDict({"p": shared, "q": shared}).double()
    st.sparsify(model, "csr", 0.5)
    fresh_shared = nn.Linear(8, 8)
    fresh = nn.ModuleDict({"p": fresh_shared, "q": fresh_shared}).double()
    result = st.load_sparse_state_dict(fresh, saved(model))
    assert not result.missing_keys and not result.unexpected_keys
    assert fresh["p"] is fresh["q"] and isinstance(fresh["p"], st.SparseLinear)
    assert torch.equal(fresh["p"].weight.to_dense(), model["p"].weight.to_dense())


def test_a_bias_the_model_and_the_checkpoint_disagree_on():
    torch.manual_seed(15)
    src = nn.Sequential(nn.Linear(8, 8))
    st.sparsify(src, "csr", 0.5)
    sd = saved(src)
    del sd["0.bias"]
    fresh = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(ValueError, match="'0' has a bias in the model and none in the checkpoint"):
        st.load_sparse_state_dict(fresh, sd)
    with pytest.raises(ValueError, match="no bias in the model and one"):
        st.load_sparse_state_dict(nn.Sequential(nn.Linear(8, 8, bias=False)), saved(src))
    assert isinstance(fresh[0], nn.Linear)


def test_a_failure_on_another_layer_leaves_the_model_as_it_was():
    """load_state_dict refusing a dense layer (here an embedding of another size) after the sparse
    layers were swapped in: they are swapped out again."""
    torch.manual_seed(16)
    src = nn.ModuleDict({"emb": nn.Embedding(100, 8), "a": nn.Linear(8, 8)})
    st.sparsify(src, "csr", 0.5)
    fresh = nn.ModuleDict({"emb": nn.Embedding(120, 8), "a": nn.Linear(8, 8)})
    dense_a = fresh["a"]
    with pytest.raises(RuntimeError, match="size mismatch"):
        st.load_sparse_state_dict(fresh, saved(src))
    assert fresh["a"] is dense_a


def test_a_linear_named_linear_inside_a_convolution():
    """A saved name ending in `.linear` is a pointwise convolution's layer only where the model has
    no module of that name."""
    def build():
        conv = nn.Conv1d(8, 8, 1)
        conv.linear = nn.Linear(8, 8)
        return nn.ModuleDict({"conv": conv})

    torch.manual_seed(17)
    src = build()
    st.sparsify(src, {"conv.linear": ("csr", 0.5)})
    fresh = build()
    result = st.load_sparse_state_dict(fresh, saved(src))
    assert not result.missing_keys and not result.unexpected_keys
    assert isinstance(fresh["conv"], nn.Conv1d) and isinstance(fresh["conv"].linear, st.SparseLinear)


def test_what_is_not_a_model_or_a_state_dict_is_refused():
    with pytest.raises(TypeError, match="nn.Module"):
        st.load_sparse_state_dict({}, {})
    with pytest.raises(TypeError, match="state_dict must map names to tensors.*got str"):
        st.load_sparse_state_dict(Net(), "pruned.pt")
